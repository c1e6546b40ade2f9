"""Eighteenth session red team (H92) of the seventeenth session's commits (db1793e..b333bb8), with
neighbour pairs through the real paths (the CLI on direct, direct-multi and dask, the API on dicts
and Rows under declared windows) and build-time probes. docs/audits.md "Eighteenth session: red
team of 83681e9.. → b333bb8" has the numbers and, for each clean check, the scratch break it
catches.

1. Found and fixed (rule 2, manifest accuracy; nothing leaked): SBHG's fallback to independent
   1-way marginals (``--sbhg-sizing auto`` at a small public n·ε) samples its tables with
   ``--method independent``'s Norm-Sub fit and balanced sampling since 64d02bb, but its manifest
   details said only ``independent 1-way marginals (fallback)``. They now name the fit and the
   sampling, read from the measurement transform (``DPIndependentMarginals.modes``).
2. Clean: the balanced sampler (64d02bb) is one systematic sample of the release, whatever its
   sharding: every column's rows over all shards are the same multiset for 1, 3 or 7 shards
   (shard plans are a function of the DP count alone), and a shard redrawn from an unpickled copy
   of its step in secure mode (a retry, Dask's recomputation of a side input per consumer) gives
   the same rows.
3. Clean: Beam's CSV header read as wrapped by ``import beamsynth`` (6085a87) returns what Beam's
   own returns on every layout where Beam's ends (CRLF, BOM, a header longer than Beam's read
   chunk, a quoted newline in the header, blank lines before it, trailing blank lines, a header
   without a newline, ``skip_blank_lines=False``, ``skiprows``, ``header: 1``), and ends where
   Beam's never does, with the bytes it read and nothing after: only reads that never ended
   change, in any Beam pipeline of a process that imported beamsynth.
4. Clean: H87's dead-letter hints (2ce1d6c: the element's misspelt key; 0e26783: the declared
   range) reach only the private dead letters: the public manifest and the WARNING logs of an API
   run carry neither the element's key nor its value.

Each clean check fails on a scratch break named in its docstring (applied by monkeypatching from a
pytest plugin outside the checkout; docs/audits.md lists them with the counts).
"""

from __future__ import annotations

import io
import json
import logging
import pickle
import re

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.testing.util import assert_that
from apache_beam.transforms.window import GlobalWindow

import beamsynth  # noqa: F401  (installs the CSV header read under test, as any import does)
from beamsynth.schemas.schema import load_schema
from beamsynth.transforms.budget import ApproxDP, PrivacyAccountant, PureDP
from beamsynth.transforms.measure import NoisyMarginal
from beamsynth.transforms.noise import RunSecret
from beamsynth.transforms.synthesis import (
    IndependentModel,
    SampleSynthetic,
    _sample_shard,
    shard_plan,
)

pytestmark = pytest.mark.audit

SCHEMA = load_schema({"name": "redteam18", "columns": [
    {"name": "a", "type": "categorical",
     "domain": {"kind": "categorical", "values": ["p", "q", "r", "s", "t"]}},
    {"name": "b", "type": "categorical", "domain": {"kind": "categorical", "values": ["x", "y", "z"]}},
    {"name": "age", "type": "integer", "domain": {"kind": "integer", "low": 0, "high": 99,
                                                   "edges": [0, 20, 40, 60, 80, 100]}},
    # 997 cells: a shifted offset moves about a third of a shard's points to another cell
    {"name": "z", "type": "integer", "domain": {"kind": "integer", "low": 0, "high": 996}}]})


def _model(sampling: str = "balanced") -> IndependentModel:
    values = [np.array([40, 9, -3, 2, -1]), np.array([30, -2, 25]), np.array([7, 19, -4, 11, 3]),
              np.arange(997) * 7 % 11 + 1]
    return IndependentModel(
        [NoisyMarginal(columns=(j,), names=(SCHEMA.names[j],), shape=(v.size,), values=v,
                       scale=2.0, budget=PureDP(epsilon=1.0)) for j, v in enumerate(values)],
        SCHEMA.shape, sampling=sampling)


# -- 1. SBHG's fallback states the fit and sampling it samples with ------------------------------
def test_sbhg_fallback_manifest_names_its_fit_and_sampling():
    """Before: ``{"model": "independent 1-way marginals (fallback)", "sizing": ...}``, no fit or
    sampling, while the fallback's model is Norm-Sub + balanced since 64d02bb (fails on the old
    code: no ``fit`` key)."""
    from beamsynth.pipelines.methods.sbhg import SBHGMethod
    from beamsynth.transforms.synthesis import DPIndependentMarginals

    adult = load_schema("adult")
    acc = PrivacyAccountant(total=ApproxDP(epsilon=1.0, delta=1e-6))
    method = SBHGMethod(schema=adult, accountant=acc, budget=ApproxDP(epsilon=1.0, delta=1e-6),
                        max_contributions=1, seed=1, options={"input_rows": 1000})
    assert isinstance(method.transform, DPIndependentMarginals)  # n·ε too small: the fallback
    details = method.details()["sbhg"]
    assert (details["fit"], details["sampling"]) == ("norm_sub", "balanced")
    assert details["model"].startswith("independent") and details["sizing"]["top_r_chosen"] == 0
    assert [s.step for s in acc.spends] == ["sbhg.fallback_independent"]  # spends unchanged


# -- 2. the balanced sampler: one sample of the release, redrawn identically ---------------------
def _codes_of(table) -> np.ndarray:
    """A synthetic table's cell codes (ages drawn inside their bin map back to the bin)."""
    return np.column_stack([SCHEMA.columns[j].encode(table.column(c).to_pylist())[0]
                            for j, c in enumerate(SCHEMA.names)])


def _release(rows: int, shard_rows: int, seed) -> list[np.ndarray]:
    """Every shard of one release as a worker draws it (``_sample_shard``, the global window)."""
    plan = shard_plan(rows, shard_rows)
    return [_codes_of(_sample_shard(SCHEMA, seed, i, n, _model(), GlobalWindow(),
                                    shards=len(plan), total=rows)) for i, n in plan]


def test_balanced_rows_are_one_sample_of_the_release_however_it_is_sharded():
    """1,000 rows, demo seed 7, in 1, 3 and 7 shards: each column's rows over all shards are the
    same multiset (the points ``(k + U)/N`` of one systematic sample, ``U`` from the stream the
    window's shards share). Catches a scratch break that draws the offset from the shard's own
    stream (``common`` := the shard stream): the shard counts then give other rows."""
    by_shards = {}
    for shard_rows in (1000, 334, 143):
        parts = _release(1000, shard_rows, 7)
        codes = np.vstack(parts)
        assert len(parts) == len(shard_plan(1000, shard_rows)) and len(codes) == 1000
        by_shards[len(parts)] = [np.sort(codes[:, j]).tolist() for j in range(codes.shape[1])]
    assert sorted(by_shards) == [1, 3, 7]
    assert by_shards[1] == by_shards[3] == by_shards[7]


def test_a_shard_redrawn_in_secure_mode_gives_the_same_rows():
    """Secure mode (a ``RunSecret`` drawn when ``SampleSynthetic`` is built): shard 1 of 3 drawn
    by two unpickled copies of the step's seed, as a retried bundle or Dask's per-consumer
    recomputation does, is the same table; another shard is not. Catches a scratch break that
    draws the shards' common stream from a fresh secret (``RandomSource(seed=None)``)."""
    step = SampleSynthetic(schema=SCHEMA, seed=None, shard_rows=334)
    secret = step._seed
    assert isinstance(secret, RunSecret)
    first, again = (pickle.loads(pickle.dumps(secret)) for _ in range(2))
    one = _sample_shard(SCHEMA, first, 1, 333, _model(), GlobalWindow(), shards=3, total=1000)
    two = _sample_shard(SCHEMA, again, 1, 333, _model(), GlobalWindow(), shards=3, total=1000)
    assert one.equals(two)
    other = _sample_shard(SCHEMA, first, 0, 334, _model(), GlobalWindow(), shards=3, total=1000)
    assert not other.slice(0, 333).equals(one)


# -- 3. the CSV header read: only reads that never ended change ----------------------------------
class _Endless(Exception):
    """More header lines asked for than any of these files holds: Beam's loop past the end."""


def _read_header(method, data: bytes, kwargs: dict, chunk: int | None):
    """``method`` (Beam's own or the installed one) on ``data``; ``"endless"`` when it reads on
    past 200 lines (every file here has fewer)."""
    from apache_beam.dataframe.io import _TextFileSplitter

    splitter = _TextFileSplitter((), kwargs)
    if chunk is not None:
        splitter._read_chunk_size = chunk
    reads = [0]
    boundary = splitter.read_to_record_boundary

    def counted(buffered, handle):
        reads[0] += 1
        if reads[0] > 200:
            raise _Endless
        return boundary(buffered, handle)

    splitter.read_to_record_boundary = counted
    try:
        return method(splitter, io.BytesIO(data))
    except _Endless:
        return "endless"


_LAYOUTS = {
    "0 bytes": b"", "blank lines": b"\n\n\n", "whitespace lines": b"  \n\t\n",
    "header only": b"a,b\n", "header without newline": b"a,b", "rows": b"a,b\n1,2\n3,4\n",
    "trailing blank lines": b"a,b\n1,2\n\n\n", "CRLF": b"a,b\r\n1,2\r\n",
    "BOM": b"\xef\xbb\xbfa,b\n1,2\n", "blank lines first": b"\n\na,b\n1,2\n",
    "quoted newline in header": b'"a\nx",b\n1,2\n', "comment first": b"# c\na,b\n1,2\n",
    "header over a read chunk": b"h" + b"c" * 70_000 + b",b\n1,2\n",
}
_READS = [{}, {"names": ["a", "b"], "header": 0}, {"header": 1}, {"skiprows": 1},
          {"header": 0, "skip_blank_lines": False}, {"comment": "#"}]


@pytest.mark.parametrize("kwargs", _READS, ids=lambda k: json.dumps(k, sort_keys=True))
def test_csv_header_read_changes_only_reads_that_never_ended(kwargs):
    """13 layouts x 2 chunk sizes (Beam's and 3 bytes) per read option: where Beam's own
    ``read_header`` ends, the installed one returns the same (header bytes, rest); where Beam's
    reads on forever, it ends with every byte of the file as the header and nothing after (pandas
    then reads no rows). Catches a scratch wrapper that ends at the first blank line instead of
    the end of the file (``if not line.strip(): raise _PastEnd``): the files with blank lines
    before or after their header change."""
    from apache_beam.dataframe.io import _TextFileSplitter

    installed = _TextFileSplitter.read_header
    beams = installed.__wrapped__
    assert beams is not installed
    endless = 0
    for name, data in _LAYOUTS.items():
        for chunk in (None, 3):
            theirs = _read_header(beams, data, kwargs, chunk)
            ours = _read_header(installed, data, kwargs, chunk)
            if theirs == "endless":
                endless += 1
                assert ours == (data, b""), (name, chunk)
            else:
                assert ours == theirs, (name, chunk)
    # Beam's loop never ended on the 0-byte file at least (both chunks) where it skips blank
    # lines; counting them (skip_blank_lines=False) it always ended
    assert endless >= 2 if kwargs.get("skip_blank_lines", True) else endless == 0


# -- 4. H87's dead-letter hints stay in the dead letters -------------------------------------------
def _names_key_and_range(reasons: list) -> None:
    """The private dead letters do carry the hints: the element's key, the declared range."""
    assert len(reasons) == 2, reasons
    assert any("'Colour_Secret'" in r for r in reasons), reasons
    assert any("[0, 99]" in r for r in reasons), reasons


_HINTS_SCHEMA = {"name": "hints", "columns": [
    {"name": "colour_secret", "type": "categorical",
     "domain": {"kind": "categorical", "values": ["red", "blue"]}},
    {"name": "age", "type": "integer", "domain": {"kind": "integer", "low": 0, "high": 99}}]}
_HINT_ELEMENTS = [{"Colour_Secret": "zz-private-value", "age": 30},
                  {"colour_secret": "red", "age": 4242}, {"colour_secret": "blue", "age": 40}]
_SECRETS = ("Colour_Secret", "zz-private-value", "4242")


def test_dead_letter_hints_are_not_logged_when_encoded(caplog):
    """Beam-free (the encoder every ``job.private`` runs): dicts and an Arrow batch with a
    misspelt key (``Colour_Secret`` holding ``zz-private-value``) and an age out of the declared
    range (``4242``): the dead letters carry the hints, no log record at WARNING or above names
    the key or a value. Catches a scratch break that logs each missing-field reason at WARNING
    (``inputs.missing_field_reason`` wrapped); the pipeline variant below adds the manifest."""
    import pyarrow as pa

    from beamsynth.transforms import inputs

    layout = inputs.KeyLayout(load_schema(_HINTS_SCHEMA))
    caplog.set_level(logging.WARNING)
    arrow = pa.table({"Colour_Secret": ["zz-private-value", "red"], "age": [30, 4242]})
    reasons = []
    for elements in (_HINT_ELEMENTS, [arrow]):
        _batches, dead = inputs.encode_elements(layout, elements, source="redteam")
        reasons.append(sorted(str(d.reason) for d in dead))
    assert all(len(r) == 2 for r in reasons), reasons
    assert sum("'Colour_Secret'" in r for rs in reasons for r in rs) == 3  # 2 dicts' + arrow's
    assert any("[0, 99]" in r for r in reasons[0])
    logged = "\n".join(r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING)
    assert not any(secret in logged for secret in _SECRETS), logged


# the whole API run with its manifest (5 s at load 10-16): slow; covered by the test above
@pytest.mark.slow
def test_dead_letter_hints_reach_neither_the_manifest_nor_the_logs(tmp_path, caplog):
    """Three dicts through ``job.private`` + ``bs.Count`` + ``bs.WriteManifest``: one whose key is
    misspelt (``Colour_Secret``, with a value ``zz-private-value``), one out of the declared age
    range (``4242``), one good. The dead letters name the key and the range; the manifest text and
    every log record at WARNING and above name neither the key nor a value. Catches a scratch
    break that logs each missing-field reason at WARNING (``missing_field_reason`` wrapped)."""
    import beamsynth as bs

    schema, elements = load_schema(_HINTS_SCHEMA), _HINT_ELEMENTS
    job = bs.PrivacyJob(epsilon=1.0, seed=5)
    caplog.set_level(logging.WARNING)
    with beam.Pipeline(runner="beamsynth.runners.local.LocalDirectRunner") as p:
        private = p | beam.Create(elements) | job.private(schema)
        _ = private | bs.Count(epsilon=1.0)
        assert_that(private.dead_letters | beam.Map(lambda d: d.reason), _names_key_and_range)
        _ = p | bs.WriteManifest(job=job, path=str(tmp_path / "m.json"))
    manifest = (tmp_path / "m.json").read_text(encoding="utf-8")
    logged = "\n".join(r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING)
    for secret in _SECRETS:
        assert secret not in manifest and secret not in logged, secret
    assert json.loads(manifest)["operational"]["rows_rejected"] == 2
    assert not re.search(r"\[0, 99\]", logged)  # the range's reason is not logged either
