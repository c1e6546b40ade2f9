"""IO robustness (seventeenth session, H89): an empty input never hangs a run.

Beam's splittable CSV reader (``ReadFromCsv``'s default) looped forever on a file that ends
before the header line it was told to skip (``names:`` + ``header: 0`` on a 0-byte file).
``beamsynth._csv_header_fix`` ends that read at the end of the file, so such a file reads as no
rows and every step releases its declared shape (docs/beam-api.md, "Seventeenth session: IO
robustness and open items (H89)"). Each test fails on the code before (a hang is reported as a
failure after a timeout: the reads run in daemon threads).
"""

from __future__ import annotations

import io
import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import beamsynth  # noqa: F401  (installs the fix, as any beamsynth import does)


def _within(seconds: float, fn: Callable[[], Any]) -> tuple[bool, Any]:
    """Run ``fn`` in a daemon thread; (finished within ``seconds``, its value)."""
    out: dict[str, Any] = {}

    def call() -> None:
        out["value"] = fn()

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    thread.join(seconds)
    return not thread.is_alive(), out.get("value")


def _splitter(**kwargs: Any) -> Any:
    from apache_beam.dataframe.io import _TextFileSplitter

    return _TextFileSplitter((), {"names": ["a", "b"], "header": 0, **kwargs})


@pytest.mark.parametrize("text", [b"", b"\n", b"\n \n\t\n", b"# c\n"])
def test_csv_header_read_ends_at_the_end_of_the_file(text: bytes) -> None:
    """Was an endless loop: past the end every line read is empty, counted blank and skipped."""
    splitter = _splitter(comment="#")
    done, value = _within(5, lambda: splitter.read_header(io.BytesIO(text)))
    assert done, f"read_header did not end on {text!r}"
    assert value == (text, b"")


@pytest.mark.parametrize(("text", "kwargs"), [
    (b"a,b\n1,2\n", {}),
    (b"\n\na,b\n1,2\n3,4", {}),
    (b"a,b", {}),
    (b"x\ny\na,b\n1,2\n", {"skiprows": 2}),
    (b"a,b\nc,d\n1,2\n", {"header": 1}),
])
def test_csv_header_read_unchanged_on_a_file_with_its_header(text: bytes, kwargs: dict) -> None:
    from apache_beam.dataframe.io import _TextFileSplitter

    splitter = _splitter(**kwargs)
    original = _TextFileSplitter.read_header.__wrapped__
    assert splitter.read_header(io.BytesIO(text)) == original(splitter, io.BytesIO(text))


def test_yaml_read_from_csv_with_names_on_a_0_byte_file_releases(tmp_path: Path) -> None:
    """``ReadFromCsv`` with ``names:`` and ``header: 0`` on a 0-byte file: the run ended never
    (Beam's reader alone, without any beamsynth step, too); now it releases the declared shape:
    one DP count, and the manifest states 0 rows read."""
    pytest.importorskip("apache_beam.yaml.main", reason="needs apache-beam[yaml]")
    from beamsynth.runners.local import LocalDirectRunner
    from tests.yaml_helpers import build, provider

    data = tmp_path / "in.csv"
    data.write_bytes(b"")
    schema = {"name": "shop", "columns": [{"name": "region", "type": "categorical", "domain": {
        "kind": "categorical", "values": ["north", "south"]}}]}
    pipeline = build({"providers": [{"include": provider()}], "pipeline": {
        "transforms": [
            {"type": "ReadFromCsv", "name": "In",
             "config": {"path": str(data), "names": ["region"], "header": 0}},
            {"type": "BeamsynthCount", "name": "Cnt", "input": "In",
             "config": {"schema": schema, "epsilon": 0.5, "seed": 3,
                        "manifest": str(tmp_path / "cnt.json")}},
            {"type": "WriteToJson", "name": "W1", "input": "Cnt",
             "config": {"path": str(tmp_path / "count")}}]}})
    # built here (Beam YAML keeps its build state per thread), run in a thread that may hang
    done, _ = _within(120, lambda: LocalDirectRunner().run_pipeline(pipeline, pipeline.options)
                      .wait_until_finish())
    assert done, "the run did not end within 120 s"
    counts = [json.loads(line) for f in tmp_path.glob("count*") for line in f.read_text().splitlines()]
    assert len(counts) == 1 and set(counts[0]) == {"noisy_count"}
    operational = json.loads((tmp_path / "cnt.json").read_text())["operational"]
    assert operational["rows_read"] == 0 and operational["rows_used"] == 0, operational


# -- 2. the CLI's id mode travels with the prefixes encoder (a worker's module is never read) ------
BIG = 2**53


def _prefix_ids_run(tmp_path: Path, *runner: str) -> tuple[bytes, dict]:
    """``beamsynth prefixes`` over ids 2**53 and 2**53 + 1 (bound 1): (output bytes, manifest)."""
    from beamsynth.pipelines.cli.main import main

    data = tmp_path / "d.csv"
    data.write_text(f"pid,c\n{BIG},a\n{BIG + 1},b\n", encoding="utf-8")
    out = tmp_path / f"keys{len(runner)}.csv"
    assert main(["prefixes", str(data), "--kind", "text", "--column", "c", "--alphabet", "ab",
                 "--max-length", "1", "--privacy-id", "pid", "--max-contributions", "1",
                 "--method", "direct", "--epsilon", "1", "--seed", "3", "--quiet",
                 "--output", str(out), *runner]) == 0
    return out.read_bytes(), json.loads(Path(f"{out}.manifest.json").read_text(encoding="utf-8"))


def test_prefix_encoder_reads_ids_as_decided_when_built(monkeypatch) -> None:
    """``EncodeKeys`` decides how ids are read when the pipeline is built, as the manifest states
    it. Was: ``encode_key_block`` read ``encode.READER_PRIVACY_IDS`` on the worker, so a launcher
    that set the switch got manifests saying ``rounded`` over ids a multi-process worker (a fresh
    module: ``exact``) read exactly. Here the switch is restored before the run, as a fresh
    worker would see it: the step still reads ids as built."""
    import apache_beam as beam
    import numpy as np
    import pandas as pd
    from apache_beam.testing.util import assert_that, equal_to

    from beamsynth.pipelines.io import encode
    from beamsynth.pipelines.io.records import RawBlock
    from beamsynth.pipelines.methods.prefixes import EncodeKeys
    from beamsynth.runners.local import LocalDirectRunner
    from beamsynth.schemas.keys import key_codec_from_spec

    codec = key_codec_from_spec({"kind": "text", "column": "c", "alphabet": "ab", "max_length": 1})
    block = RawBlock("x", {"c": pd.Series(["a", "b"], dtype=object),
                           "pid": pd.Series([str(BIG), str(BIG + 1)], dtype=object)},
                     np.arange(1, 3))
    p = beam.Pipeline(runner=LocalDirectRunner())
    for mode, pids in (("rounded", [str(BIG)] * 2), ("exact", [str(BIG), str(BIG + 1)])):
        with monkeypatch.context() as m:
            m.setattr(encode, "READER_PRIVACY_IDS", mode)
            out = (p | f"In{mode}" >> beam.Create([block])
                   | f"Enc{mode}" >> EncodeKeys(codec=codec, privacy_id="pid"))
        assert_that(out["batches"] | f"Ids{mode}" >> beam.FlatMap(lambda b: list(b.pids)),
                    equal_to(pids), label=f"Check{mode}")
    p.run().wait_until_finish()  # the switch is back at "exact" here


@pytest.mark.slow  # two CLI runs, one on direct-multi (~15 s); the default test above covers it
def test_prefix_ids_switch_set_in_the_launcher_reaches_direct_multi(tmp_path, monkeypatch) -> None:
    """The switch flipped in the launcher: ``direct`` and ``direct-multi`` write the same bytes
    and manifests saying ``rounded`` over 1 row dropped by the bound (was: direct-multi's worker
    read ids exactly, 0 dropped, under a manifest saying ``rounded``)."""
    from beamsynth.pipelines.io import encode

    monkeypatch.setattr(encode, "READER_PRIVACY_IDS", "rounded")
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    one, m1 = _prefix_ids_run(tmp_path / "a")
    multi, m2 = _prefix_ids_run(tmp_path / "b", "--runner", "direct-multi")
    for m in (m1, m2):
        assert m["release"]["privacy_unit"]["ids"] == "rounded"
        assert m["operational"]["rows_dropped_by_bound"] == 1, m["operational"]
    assert one == multi


# -- 3. ordering a window's key tables reads no content unless two tables tie on size ---------------
def _old_table_order(table) -> tuple:
    """``table_order`` before H89: every unlabelled table's content as one JSON text."""
    from beamsynth.schemas.tables import part_label
    from beamsynth.transforms.outputs import _content_key

    label = part_label(table)
    return label, table.num_rows, "" if label else _content_key(table)


def test_table_order_reads_content_only_for_tables_of_one_size(monkeypatch) -> None:
    """Was: the content of every unlabelled table became a JSON text (a window's synthetic keys,
    as many as its DP count of records) just to order a dozen tables by size."""
    import random

    import pyarrow as pa

    from beamsynth.transforms import outputs

    rng = random.Random(0)
    tables = [pa.table({"q": [rng.choice("abc") for _ in range(rng.randint(0, 6))]})
              for _ in range(60)]  # sizes 0-6: many ties, broken by content as before
    want = sorted(range(60), key=lambda i: _old_table_order(tables[i]))
    assert sorted(range(60), key=lambda i: outputs.table_order(tables[i])) == want
    calls = []
    real = outputs._content_key
    monkeypatch.setattr(outputs, "_content_key", lambda t: calls.append(1) or real(t))
    sized = [pa.table({"q": ["k"] * n}) for n in (5, 1, 3000, 2)]
    assert [t.num_rows for t in sorted(sized, key=outputs.table_order)] == [1, 2, 5, 3000]
    assert calls == []
