"""Every write goes through Beam's ``FileSystems``: outputs, dead letters, manifests, reports and
release folders land on a file system registered under a test scheme (``testfs://``, a prefix
mapped to a local folder), and nothing is written to a local folder named after the scheme (what
``--output gs://bucket/out.csv`` did: a local folder ``gs:``).

Beam finds file systems through ``FileSystem.__subclasses__()``: defining :class:`PrefixFileSystem`
registers the scheme for the in-process DirectRunner the commands run on here.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pandas as pd
import pytest
from apache_beam.io.filesystem import BeamIOError, FileMetadata, MatchResult
from apache_beam.io.filesystems import FileSystems
from apache_beam.io.localfilesystem import LocalFileSystem

from beamsynth.pipelines.cli.main import main
from beamsynth.pipelines.io import filesystem as fs

ADULT = Path(__file__).resolve().parents[2] / "examples" / "data" / "adult" / "adult.csv"
SCHEME = "testfs"


class PrefixFileSystem(LocalFileSystem):
    """``testfs://a/b`` is the local file ``ROOT/a/b`` (ROOT set by the fixture)."""

    ROOT: str | None = None

    @classmethod
    def scheme(cls) -> str:
        return SCHEME

    def _local(self, path: str) -> str:
        if self.ROOT is None:
            raise OSError("testfs is not mounted")
        if not path.startswith(f"{SCHEME}://"):  # Beam's match() calls back with local paths
            return path
        return os.path.join(self.ROOT, path[len(f"{SCHEME}://"):].lstrip("/"))

    def _url(self, local: str) -> str:
        return f"{SCHEME}://" + os.path.relpath(local, self.ROOT).replace(os.sep, "/")

    def join(self, basepath: str, *paths: str) -> str:
        base = basepath if basepath.endswith("://") else basepath.rstrip("/") + "/"
        return base + "/".join(p.strip("/") for p in paths)

    def split(self, path: str) -> tuple[str, str]:
        rest = path[len(f"{SCHEME}://"):].rstrip("/")
        head, _, tail = rest.rpartition("/")
        return f"{SCHEME}://{head}", tail

    def mkdirs(self, path: str) -> None:
        super().mkdirs(self._local(path))

    def match(self, patterns, limits=None):
        results = super().match([self._local(p) for p in patterns], limits)
        return [MatchResult(p, [FileMetadata(self._url(m.path), m.size_in_bytes,
                                             m.last_updated_in_seconds) for m in r.metadata_list])
                for p, r in zip(patterns, results)]

    def create(self, path, *args, **kwargs):
        return super().create(self._local(path), *args, **kwargs)

    def open(self, path, *args, **kwargs):
        return super().open(self._local(path), *args, **kwargs)

    def copy(self, sources, destinations):
        return super().copy([self._local(s) for s in sources], [self._local(d) for d in destinations])

    def rename(self, sources, destinations):
        for d in destinations:  # like an object store: no folder needs to exist first
            os.makedirs(os.path.dirname(self._local(d)), exist_ok=True)
        return super().rename([self._local(s) for s in sources],
                              [self._local(d) for d in destinations])

    def exists(self, path):
        return super().exists(self._local(path))

    def size(self, path):
        return super().size(self._local(path))

    def last_updated(self, path):
        return super().last_updated(self._local(path))

    def checksum(self, path):
        return super().checksum(self._local(path))

    def metadata(self, path):
        m = super().metadata(self._local(path))
        return FileMetadata(path, m.size_in_bytes, m.last_updated_in_seconds)

    def delete(self, paths):
        missing = {}
        for p in paths:
            local = self._local(p)
            if os.path.isdir(local):
                shutil.rmtree(local)
            elif os.path.exists(local):
                os.remove(local)
            else:
                missing[p] = OSError(f"{p} does not exist")
        if missing:
            raise BeamIOError("Delete operation failed", missing)


@pytest.fixture
def testfs(tmp_path, monkeypatch):
    """``testfs://`` mounted on ``tmp_path/store``; the working directory is ``tmp_path/cwd``."""
    store, cwd = tmp_path / "store", tmp_path / "cwd"
    store.mkdir()
    cwd.mkdir()
    monkeypatch.setattr(PrefixFileSystem, "ROOT", str(store))
    monkeypatch.chdir(cwd)
    yield store
    scheme_folders = [p for p in tmp_path.rglob(f"{SCHEME}:*")]
    assert scheme_folders == [], f"local folders named after the scheme: {scheme_folders}"
    assert list(cwd.iterdir()) == []


@pytest.fixture(scope="module")
def adult_small(tmp_path_factory):
    if not ADULT.exists():
        pytest.skip(f"{ADULT} absent")
    df = pd.read_csv(ADULT, nrows=1500, dtype=str, keep_default_na=False)
    df.loc[3, "age"] = "999"  # one dead letter
    path = tmp_path_factory.mktemp("adult") / "adult.csv"
    df.to_csv(path, index=False)
    return str(path)


def _cli(*args: str) -> None:
    assert main([*args, "--quiet"]) == 0


def _dead_letters(store: Path, name: str) -> list[dict]:
    return [json.loads(line) for line in (store / name).read_text().splitlines()]


# -- unit: the helpers on the test file system ----------------------------------------------------
def test_atomic_writes_and_folder_moves_on_a_beam_file_system(testfs):
    fs.write_json_atomic(f"{SCHEME}://a/b/m.json", {"x": 1})
    fs.write_text_atomic(f"{SCHEME}://a/b/r.html", "<p>é</p>")
    assert json.loads((testfs / "a/b/m.json").read_text()) == {"x": 1}
    assert fs.read_text(f"{SCHEME}://a/b/r.html") == "<p>é</p>"
    assert sorted(p.name for p in (testfs / "a/b").iterdir()) == ["m.json", "r.html"]  # no temp left
    assert fs.list_files(f"{SCHEME}://a") == [f"{SCHEME}://a/b/m.json", f"{SCHEME}://a/b/r.html"]
    fs.move_folder(f"{SCHEME}://a", f"{SCHEME}://c", marker="b/m.json")
    assert not fs.folder_exists(f"{SCHEME}://a") and fs.folder_exists(f"{SCHEME}://c")
    assert (testfs / "c/b/m.json").exists()


def test_a_failed_write_leaves_the_old_file_and_no_temporary(testfs, monkeypatch):
    fs.write_json_atomic(f"{SCHEME}://m.json", {"v": 1})
    monkeypatch.setattr(PrefixFileSystem, "rename", lambda *a: (_ for _ in ()).throw(OSError("gone")))
    with pytest.raises(OSError, match="gone"):
        fs.write_json_atomic(f"{SCHEME}://m.json", {"v": 2})
    assert json.loads((testfs / "m.json").read_text()) == {"v": 1}
    assert [p.name for p in testfs.iterdir()] == ["m.json"]


def test_the_ledger_must_stay_local(tmp_path):
    from beamsynth.pipelines.releases.config import ReleaseConfigError, load_release_config

    cfg = {"name": "n", "folder": f"{SCHEME}://rel/n", "budget": {"epsilon": 1},
           "ledger": {"path": "gs://bucket/ledger.sqlite", "policies": {"s": {"epsilon": 5}}},
           "tables": [{"name": "t", "input": str(ADULT), "schema": "adult", "epsilon": 1}]}
    with pytest.raises(ReleaseConfigError, match=r"ledger.path: \('gs://bucket/ledger.sqlite'\) "
                                                 r"must be a local file"):
        load_release_config(cfg)
    with pytest.raises(ValueError, match="must be a local file path"):
        fs.require_local("s3://b/l.sqlite", "ledger")


# -- every command with its outputs on testfs:// -----------------------------------------------------
def test_synthesize_and_histogram_write_everything_through_filesystems(testfs, adult_small):
    _cli("synthesize", adult_small, "--schema", "adult", "--epsilon", "1", "--rows", "300",
         "--output", f"{SCHEME}://out/syn.csv", "--seed", "3")
    rows = (testfs / "out/syn.csv").read_text().splitlines()
    assert len(rows) == 301
    manifest = json.loads((testfs / "out/syn.csv.manifest.json").read_text())
    assert manifest["operational"]["rows_read"] == 1500
    assert manifest["release"]["outputs"]["synthetic"] == f"{SCHEME}://out/syn.csv"
    assert [r["row"] for r in _dead_letters(testfs, "out/syn.csv.rejected.jsonl")] == [4]

    _cli("histogram", adult_small, "--column", "sex", "--domain", "list:Male,Female",
         "--epsilon", "1", "--tolerance", "0.5", "--output", f"{SCHEME}://out/hist.csv", "--seed", "3")
    hist = pd.read_csv(testfs / "out/hist.csv")
    assert sorted(hist["sex"]) == ["Female", "Male"]
    assert json.loads((testfs / "out/hist.csv.manifest.json").read_text())["operational"][
        "rows_used"] == 1500
    assert (testfs / "out/hist.csv.rejected.jsonl").read_text() == ""
    assert sorted(p.name for p in (testfs / "out").iterdir()) == [
        "hist.csv", "hist.csv.manifest.json", "hist.csv.rejected.jsonl",
        "syn.csv", "syn.csv.manifest.json", "syn.csv.rejected.jsonl"]


def test_prefixes_write_everything_through_filesystems(testfs, adult_small):
    _cli("prefixes", adult_small, "--kind", "text", "--column", "occupation", "--max-length", "6",
         "--method", "improved", "--epsilon", "2", "--output", f"{SCHEME}://p/keys.csv", "--seed", "3")
    assert sorted(p.name for p in (testfs / "p").iterdir()) == [
        "keys.csv", "keys.csv.manifest.json", "keys.csv.rejected.jsonl", "keys.csv.tree.csv"]
    manifest = json.loads((testfs / "p/keys.csv.manifest.json").read_text())
    op = manifest["operational"]
    assert op["rows_read"] == 1500 and op["rows_used"] + op["rows_rejected"] == 1500
    assert len(_dead_letters(testfs, "p/keys.csv.rejected.jsonl")) == op["rows_rejected"]


def test_release_folder_is_published_on_the_file_system(testfs, adult_small, tmp_path):
    config = tmp_path / "release.yaml"
    config.write_text(f"""
name: small
folder: {SCHEME}://rel/small-{{date}}
budget: {{epsilon: 2.0}}
ledger: {{path: {tmp_path}/ledger.sqlite, policies: {{adult: {{epsilon: 10}}}}}}
seed: 3
demo: true
tables:
  - {{name: adult, input: {adult_small}, schema: adult, epsilon: 1.5, rows: 200, formats: [csv]}}
  - {{name: sex, kind: histogram, input: {adult_small}, schema: adult, column: sex,
      tolerance: 0.01, epsilon: 0.5}}
reports: {{private: false, public: false}}
""")
    _cli("release", str(config), "--date", "2026-11-24")
    folder = testfs / "rel" / "small-2026-11-24"
    files = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
    assert files == ["private/adult.manifest.json", "private/adult.rejected.jsonl",
                     "private/sex.manifest.json", "private/sex.rejected.jsonl",
                     "public/adult.csv", "public/adult.model.json", "public/sex.csv", "release.json"]
    assert [p.name for p in (testfs / "rel").iterdir()] == ["small-2026-11-24"]  # no temp folder
    release = json.loads((folder / "release.json").read_text())
    assert set(release["tables"]) == {"adult", "sex"}
    assert len((folder / "public/adult.csv").read_text().splitlines()) == 201
    assert FileSystems.exists(f"{SCHEME}://rel/small-2026-11-24/release.json")


def test_windowed_releases_stream_through_filesystems(testfs):
    """``WindowedSynthesis`` to ``testfs://``: each declared window's part files, its CSV and its
    manifest go through ``FileSystems`` (nothing local, no part folder left), and the manifest
    names the release by its ``testfs://`` path."""
    import datetime as dt

    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.transforms import window as beam_window

    from beamsynth.pipelines.io.single_file import remove_temp_folders_on_failure
    from beamsynth.pipelines.methods.synthesize import SynthesisConfig, plan_synthesis
    from beamsynth.pipelines.stream import DAY, WindowedSynthesis
    from beamsynth.schemas.schema import load_schema

    t0 = int(dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc).timestamp())
    schema = load_schema({"columns": [
        {"name": "c", "type": "categorical", "domain": {"kind": "categorical", "values": ["a", "b"]}},
        {"name": "n", "type": "integer", "domain": {"kind": "integer", "low": 0, "high": 9, "bins": 5}}]})
    out = f"{SCHEME}://w/day.csv"
    plan = plan_synthesis(SynthesisConfig(input="stream", schema=schema, output=out, epsilon=2.0,
                                          seed=5, shard_rows=40, method="independent", rows=100))
    batch, bad = schema.encode_columns({"c": pd.Series(["a", "b"] * 50, dtype=object),
                                        "n": pd.Series([str(i % 10) for i in range(100)], dtype=object)},
                                       100)
    assert bad == []
    stream = WindowedSynthesis(plan=plan, output=out, windows_start=t0, windows_end=t0 + DAY,
                               window_seconds=DAY)
    p = beam.Pipeline(options=PipelineOptions(["--direct_running_mode=in_memory"]))
    _ = p | beam.Create([beam_window.TimestampedValue(batch, t0 + 60)], reshuffle=False) | stream
    with remove_temp_folders_on_failure(p):
        p.run().wait_until_finish()
    days = ["day.20240101T000000Z.csv"]
    assert sorted(p.name for p in (testfs / "w").iterdir()) == sorted(
        [*days, *(d + ".manifest.json" for d in days)])
    for d in days:
        assert len((testfs / "w" / d).read_text().splitlines()) == 101
        manifest = json.loads((testfs / "w" / (d + ".manifest.json")).read_text())
        assert manifest["release"]["outputs"]["synthetic"] == f"{SCHEME}://w/{d}"


def test_ledger_reconciles_release_folders_on_the_file_system(testfs, tmp_path):
    """Release folders on ``testfs://`` (the ledger stays local): the ledger keeps the folder as
    given (not made absolute as a local path), reads a published folder's ``release.json``
    through ``FileSystems`` (its spend stays committed) and deletes a killed release's unpublished
    temporary folder there (its spend is refunded)."""
    import sqlite3
    import subprocess
    import sys

    from beamsynth.pipelines.releases.ledger import (
        RELEASE_MARKER,
        LedgerPolicy,
        LedgerSpend,
        PrivacyLedger,
        temp_folder,
    )

    ledger = PrivacyLedger(str(tmp_path / "ledger.sqlite"))
    policies = {"src": LedgerPolicy(epsilon=3.0)}
    spends = [LedgerSpend(source="src", privacy_unit="record", step="t.marginals", epsilon=1.0,
                          delta=0.0, mechanism="discrete Laplace")]
    done, lost = (ledger.reserve(run_key=k, name=k, folder=f"{SCHEME}://rel/{k}", spends=spends,
                                 policies=policies) for k in ("done", "lost"))
    assert sorted(r["folder"] for r in ledger.releases()) == [f"{SCHEME}://rel/done",
                                                               f"{SCHEME}://rel/lost"]
    fs.write_json_atomic(f"{SCHEME}://rel/done/{RELEASE_MARKER}", {"release_id": done})  # published
    lost_tmp = temp_folder(f"{SCHEME}://rel/lost", lost)
    assert lost_tmp == f"{SCHEME}://rel/.lost.tmp-{lost}"
    fs.write_text_atomic(f"{lost_tmp}/public/t.csv", "a\n1\n")  # computed, never published
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()  # a pid that is gone: both owners died before committing
    with sqlite3.connect(ledger.path) as con:
        con.execute("UPDATE releases SET pid = ?", (proc.pid,))
    assert sorted(ledger.reconcile()) == sorted([(done, "committed"), (lost, "aborted")])
    assert ledger.summary()[0]["epsilon_spent"] == pytest.approx(1.0)
    assert sorted(p.name for p in (testfs / "rel").iterdir()) == ["done"]
