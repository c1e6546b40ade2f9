"""Fault injection: retried bundles change nothing but fresh noise, nothing is released twice,
and manifests are written atomically.

The bundle-based DirectRunner retries a failed bundle (up to 4 attempts) and discards what the
failed attempt emitted; the default (FnApi) DirectRunner does not retry, so a failure there must
fail the run without releasing anything. :class:`~beamsynth.transforms.faults.FailOnceFn` fails
once mid-bundle, controlled by a flag file (portable across processes and workers).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import BeamAssertException, assert_that

from beamsynth.pipelines.io.manifest import manifest_path, write_json_atomic
from beamsynth.pipelines.io.read import ReadRecords
from beamsynth.pipelines.methods import synthesize as synth_mod
from beamsynth.pipelines.methods.synthesize import SynthesisConfig, run_synthesis
from beamsynth.schemas.schema import EncodedBatch
from beamsynth.transforms.budget import PureDP
from beamsynth.transforms.faults import FailOnceFn, InjectedFault, recorded_element
from beamsynth.transforms.measure import DPMarginals
from beamsynth.transforms.noise import RandomSource, discrete_laplace
from beamsynth.transforms.synthesis import DPCount
from beamsynth.transforms.units import BoundContributions
from tests.audit.cases import SCHEMA

pytestmark = pytest.mark.audit

RETRYING = "BundleBasedDirectRunner"


def _batches(n_batches: int = 6, rows: int = 5) -> list[EncodedBatch]:
    rs = RandomSource(seed=1)
    return [EncodedBatch(rs.child(i).integers(3, rows * 3).reshape(rows, 3).astype(np.int32))
            for i in range(n_batches)]


def _exactly(expected):
    def match(actual):
        if len(actual) != 1:
            raise BeamAssertException(f"released {len(actual)} times: {actual}")
        if expected is not None and actual[0] != expected:
            raise BeamAssertException(f"released {actual[0]}, expected {expected}")
    return match


@pytest.mark.parametrize("where", ["before counting", "after noise"])
def test_retried_bundle_releases_the_same_count_once(tmp_path, where):
    """Seeded DPCount with a one-time failure before counting or after noising: the retry gives
    exactly the release of a fault-free run (same seed), once."""
    batches, eps, seed = _batches(), 0.5, 17
    exact = sum(len(b) for b in batches)
    noise = int(discrete_laplace(RandomSource(seed=seed).child("count", "global"), 1 / eps, 1)[0])
    flag = str(tmp_path / "flag")
    with beam.Pipeline(runner=RETRYING) as p:
        pc = p | beam.Create(batches, reshuffle=False)
        if where == "before counting":
            pc = pc | "Fail" >> beam.ParDo(FailOnceFn(flag, after=2))
        counts = pc | DPCount(budget=PureDP(epsilon=eps), seed=seed)
        if where == "after noise":
            counts = counts | "Fail" >> beam.ParDo(FailOnceFn(flag, after=0))
        assert_that(counts | beam.Map(lambda c: c.value), _exactly(exact + noise))
    assert os.path.exists(flag), "the fault did not fire"


def test_retry_in_secure_mode_releases_once_with_the_same_noise(tmp_path):
    """Secure noise (no seed), a failure right after the noise step: the run releases once,
    exactly the value the failed attempt saw. (Here the runner replays the noised element; the
    audits that re-execute the noise DoFns themselves are in tests/audit/test_redraws.py.)"""
    flag = str(tmp_path / "flag")
    with beam.Pipeline(runner=RETRYING) as p:
        counts = (p | beam.Create(_batches(), reshuffle=False)
                  | DPCount(budget=PureDP(epsilon=1.0))
                  | beam.ParDo(FailOnceFn(flag, after=0, record=True)))
        released = str(tmp_path / "released")
        counts | beam.Map(lambda c: open(released, "a").write(f"{c.value}\n"))
        assert_that(counts | beam.Map(lambda c: (c.scale, c.budget)), _exactly((1.0, PureDP(epsilon=1.0))))
    assert os.path.exists(flag)
    failed = recorded_element(flag)
    with open(released, encoding="utf-8") as fh:
        assert fh.read().split() == [str(failed.value)]


def _marginals_to_file(tmp_path, csv_path: str, out: str, flag: str | None) -> list[str]:
    """Read → (fault) → bound → DPMarginals → one JSON line per release, written to ``out``."""
    with beam.Pipeline(runner=RETRYING) as p:
        batches = (p | ReadRecords(csv_path, SCHEMA, block_rows=4))["batches"]
        if flag is not None:
            batches = batches | "Fail" >> beam.ParDo(FailOnceFn(flag, after=1))
        released = (batches
                    | BoundContributions(max_contributions=2, seed=3, num_shards=3)
                    | DPMarginals(specs=[(0,), (0, 1)], shape=SCHEMA.shape, names=SCHEMA.names,
                                  budgets=[PureDP(epsilon=0.5)] * 2, max_contributions=2, seed=4))
        if flag is not None:
            released = released | "FailAfter" >> beam.ParDo(FailOnceFn(flag + ".after", after=0))
        (released
         | beam.Map(lambda ms: json.dumps([m.to_dict() for m in ms]))
         | beam.io.WriteToText(out, num_shards=1, shard_name_template=""))
    with open(out, encoding="utf-8") as fh:
        return fh.read().splitlines()


def test_retried_reads_and_noise_write_the_same_release_once(tmp_path):
    """The whole measure chain from a file, with a failure mid-read and one after noising:
    the written release equals the fault-free one, and it is written once."""
    csv_path = tmp_path / "in.csv"
    rng = RandomSource(seed=5).numpy_generator()
    lines = ["color,age,city,pid"] + [
        f"{rng.choice(['red', 'green', 'blue', 'pink'])},{rng.integers(0, 100)},x,u{rng.integers(0, 9)}"
        for _ in range(40)]
    csv_path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    clean = _marginals_to_file(tmp_path, str(csv_path), str(tmp_path / "clean.jsonl"), None)
    flag = str(tmp_path / "flag")
    faulty = _marginals_to_file(tmp_path, str(csv_path), str(tmp_path / "faulty.jsonl"), flag)
    assert os.path.exists(flag) and os.path.exists(flag + ".after")
    assert len(clean) == 1 and faulty == clean


def _synth_config(tmp_path, out: str) -> SynthesisConfig:
    csv_path = tmp_path / "in.csv"
    if not csv_path.exists():
        csv_path.write_text("color,age,city,pid\n" + "".join(f"red,{i},y,u{i}\n" for i in range(30)),
                            encoding="utf-8")
    return SynthesisConfig(input=str(csv_path), schema=SCHEMA, output=out, epsilon=1.0, rows=50,
                           max_contributions=1, seed=8, shard_rows=20)


def _fail_once_count_out(flag: str):
    original = synth_mod._count_out

    def count_out(table):
        try:
            fd = os.open(flag, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return original(table)
        os.close(fd)
        raise InjectedFault("injected failure while emitting synthetic rows")
    return count_out


def test_synthesize_retry_writes_one_release_and_counts_rows_once(tmp_path, monkeypatch):
    """run_synthesis with a one-time failure in the sampling stage (retrying runner): the output
    has the requested rows once, the manifest says so, and it matches a fault-free run."""
    clean_out = str(tmp_path / "clean.csv")
    clean = run_synthesis(_synth_config(tmp_path, clean_out), PipelineOptions(runner=RETRYING))
    flag = str(tmp_path / "flag")
    monkeypatch.setattr(synth_mod, "_count_out", _fail_once_count_out(flag))
    out = str(tmp_path / "faulty.csv")
    m = run_synthesis(_synth_config(tmp_path, out), PipelineOptions(runner=RETRYING))
    assert os.path.exists(flag)
    with open(out, encoding="utf-8") as fh, open(clean_out, encoding="utf-8") as gh:
        rows, clean_rows = fh.read().splitlines(), gh.read().splitlines()
    assert len(rows) == 1 + 50 and sorted(rows) == sorted(clean_rows)
    assert m["release"]["rows_out"] == clean["release"]["rows_out"] == 50
    assert m["operational"]["rows_read"] == 30


def test_failed_run_without_retries_releases_nothing(tmp_path, monkeypatch):
    """The FnApi DirectRunner does not retry: the run fails and no output or manifest appears."""
    flag = str(tmp_path / "flag")
    monkeypatch.setattr(synth_mod, "_count_out", _fail_once_count_out(flag))
    out = str(tmp_path / "out.csv")
    with pytest.raises(Exception, match="injected failure"):
        run_synthesis(_synth_config(tmp_path, out), PipelineOptions(runner="DirectRunner"))
    assert not os.path.exists(out) and not os.path.exists(manifest_path(out))


def test_fail_once_validation():
    with pytest.raises(ValueError, match=r"after \(-1\) must be an int >= 0"):
        FailOnceFn("/tmp/x", after=-1)
    with pytest.raises(ValueError, match=r"flag_path \(''\) must be a non-empty path"):
        FailOnceFn("")


# -- atomic manifests ------------------------------------------------------------------------------
def test_interrupted_manifest_write_keeps_the_old_file(tmp_path, monkeypatch):
    """An exception in the middle of writing (after part of the JSON is out) leaves the previous
    manifest intact and no temporary file behind."""
    path = str(tmp_path / "out.manifest.json")
    write_json_atomic(path, {"version": "old"})

    from beamsynth.pipelines.io import filesystem as filesystem_mod

    real_create = filesystem_mod._create

    def broken_create(tmp):  # the temporary file gets half the bytes, then the write is interrupted
        fh = real_create(tmp)
        real_write = fh.write

        def write(data):
            real_write(data[: len(data) // 2])
            raise KeyboardInterrupt("interrupted mid-write")
        fh.write = write
        return fh

    monkeypatch.setattr(filesystem_mod, "_create", broken_create)
    with pytest.raises(KeyboardInterrupt):
        write_json_atomic(path, {"version": "new"})
    monkeypatch.undo()
    with open(path, encoding="utf-8") as fh:
        assert json.load(fh) == {"version": "old"}
    assert os.listdir(tmp_path) == ["out.manifest.json"]


def test_failed_rename_keeps_the_old_file(tmp_path, monkeypatch):
    path = str(tmp_path / "m.json")
    write_json_atomic(path, {"v": 1})
    # the write renames through Beam's FileSystems (LocalFileSystem.rename → os.rename)
    monkeypatch.setattr(os, "rename", lambda *a: (_ for _ in ()).throw(OSError("disk gone")))
    with pytest.raises(OSError, match="disk gone"):
        write_json_atomic(path, {"v": 2})
    monkeypatch.undo()
    with open(path, encoding="utf-8") as fh:
        assert json.load(fh) == {"v": 1}
    assert os.listdir(tmp_path) == ["m.json"]


_WRITER = textwrap.dedent("""
    import sys
    from beamsynth.pipelines.io.manifest import write_json_atomic
    path = sys.argv[1]
    big = ["x" * 100] * 20000
    i = 0
    while True:
        write_json_atomic(path, {"version": i % 2, "payload": big})
        i += 1
""")


def test_killed_writer_never_leaves_a_torn_manifest(tmp_path):
    """A process writing manifests in a loop is read concurrently and then SIGKILLed at random
    moments: every read, and the file after each kill, is a complete manifest."""
    path = str(tmp_path / "out.manifest.json")
    write_json_atomic(path, {"version": 1, "payload": []})
    rng = np.random.default_rng(0)
    reads = 0
    for _ in range(3):
        proc = subprocess.Popen([sys.executable, "-c", _WRITER, path])
        try:
            deadline = time.time() + float(rng.uniform(0.8, 2.0))
            while time.time() < deadline:
                with open(path, encoding="utf-8") as fh:
                    assert json.load(fh)["version"] in (0, 1)
                reads += 1
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        with open(path, encoding="utf-8") as fh:
            assert json.load(fh)["version"] in (0, 1)
    assert reads > 3
