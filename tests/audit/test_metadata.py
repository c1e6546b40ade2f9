"""No data-derived metadata: everything a mechanism releases besides noisy values is the same on
neighbouring datasets (or is itself a DP quantity with its budget in the ledger).

Per registered mechanism: ``case.public(release)`` (column lists, shapes, bin layout, scales,
budgets, tree shape, output size when fixed...) must be identical for the two datasets of every
hard pair, under independent noise. The deliberately broken data-derived domain fails the check.
For the full ``synthesize`` pipeline the manifest's ``release`` part is compared on neighbouring
input files.
"""

from __future__ import annotations

import copy
import json

import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from beamsynth.pipelines.methods.synthesize import SynthesisConfig, run_synthesis
from beamsynth.transforms.noise import RandomSource
from tests.audit.cases import AUDITS, BROKEN, SCHEMA

pytestmark = pytest.mark.audit

CASES = [(n, i) for n, c in AUDITS.items() if c.public is not None for i in range(len(c.pairs))]


@pytest.mark.parametrize("name,i", CASES, ids=[f"{n}-{i}" for n, i in CASES])
def test_public_part_of_release_is_data_independent(name, i):
    case = AUDITS[name]
    pair = case.pairs[i]
    rs = RandomSource(seed=41).child(name, i)
    ref = case.public(case.run(pair.smaller, rs.child("a")))
    for j in range(3):
        assert case.public(case.run(pair.smaller, rs.child("s", j))) == ref
        assert case.public(case.run(pair.larger, rs.child("l", j))) == ref, pair.name


def test_check_catches_a_data_derived_domain():
    case = BROKEN["histogram: data-derived domain"]
    pair = case.pairs[0]
    rs = RandomSource(seed=1)
    assert case.public(case.run(pair.smaller, rs.child(0))) != case.public(case.run(pair.larger, rs.child(1)))


def _write(path, rows):
    path.write_text("color,age,city,pid\n" + "".join(",".join(map(str, r)) + "\n" for r in rows),
                    encoding="utf-8")


def _release(tmp_path, name, rows, n_rows):
    src = tmp_path / f"{name}.csv"
    _write(src, rows)
    out = tmp_path / name / "synthetic.csv"
    m = run_synthesis(SynthesisConfig(input=str(src), schema=SCHEMA, output=str(out), epsilon=1.0,
                                      rows=n_rows, max_contributions=2),
                      PipelineOptions(runner="DirectRunner"))
    ops = m["operational"]
    assert ops["rows_read"] == len(rows) == (ops["rows_used"] + ops["rows_rejected"]
                                             + ops["rows_dropped_by_bound"])  # used: after the bound
    rejected = (tmp_path / name / "synthetic.csv.rejected.jsonl").read_text(encoding="utf-8").splitlines()
    assert len(rejected) == ops["rows_rejected"] and all(json.loads(r)["reason"] for r in rejected)
    release = copy.deepcopy(m["release"])
    release["outputs"] = {k: v.replace(str(tmp_path / name), "OUT") for k, v in release["outputs"].items()}
    header = out.read_text(encoding="utf-8").splitlines()[0]
    return release, header


@pytest.mark.parametrize("n_rows", [None, pytest.param(40, marks=pytest.mark.slow)])
def test_manifest_release_part_is_data_independent(tmp_path, n_rows):
    """Neighbouring inputs (plus a heavy unit with out-of-domain values): the manifest's release
    part and the output header are identical, except ``rows_out`` when it is the DP row count
    (then the ``row_count`` spend in the ledger accounts for it)."""
    base = [("red", 20 + i, "x", f"u{i}") for i in range(20)]
    heavy = base + [("purple", 150, "y", "heavy")] * 9 + [("blue", 99, "y", "heavy")] * 3
    a, ha = _release(tmp_path, "a", base, n_rows)
    b, hb = _release(tmp_path, "b", heavy, n_rows)
    assert ha == hb == ",".join(SCHEMA.names)
    if n_rows is None:
        spends = [s["step"] if isinstance(s, dict) and "step" in s else s for s in a["budget"]["spends"]]
        assert any("row_count" in str(s) for s in spends)
        a.pop("rows_out"), b.pop("rows_out")
    else:
        assert a["rows_out"] == b["rows_out"] == n_rows
    assert a == b
