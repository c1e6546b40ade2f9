"""Session 11 audit (H30): what beamsynth *publishes*, on neighbour pairs through the real entry points.

Each test runs D and a neighbour D' (one record added, one malformed line, one out-of-domain
value, ...) through a CLI command, ``beamsynth release`` or the API with the same seed, and diffs
everything a user would publish: output files, the manifest's public part, ``release.json`` and
``public/``. Every difference must be DP output (same seed and same used records: identical) or
sit in the private part.

1. ``beamsynth release`` with its default private quality report: the report read the real rows
   with pandas, so D + one CSV line with an extra field (or one invalid JSON line) stopped the
   whole release (``Error tokenizing data. C error: Expected 16 fields in line 102, saw 17``, exit
   2, nothing published) while D published — whether a release happens depended on one record
   (rules 7, 8). The report now reads the records the pipeline uses (its own readers and
   encoder), and any failure of the private report is written into it instead of stopping the
   release.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from beamsynth.pipelines.cli.main import main

pytestmark = pytest.mark.audit

ROOT = Path(__file__).resolve().parents[2]
ADULT = ROOT / "examples" / "data" / "adult" / "adult.csv"
needs_adult = pytest.mark.skipif(not ADULT.exists(), reason="examples/data/adult/adult.csv absent")


def _adult_lines(n: int) -> tuple[str, list[str]]:
    lines = ADULT.read_text(encoding="utf-8").splitlines()
    return lines[0], lines[1:n + 1]


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


_RUN_IDS = re.compile(rb'[0-9a-f]{32}|\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00')


# -- 1. beamsynth release: the private quality report must not decide whether a release happens ----
_RELEASE = """
name: small
folder: {root}/rel/small
budget: {{epsilon: 2.0}}
ledger: {{path: {root}/ledger.sqlite, policies: {{adult: {{epsilon: 10}}}}}}
seed: 3
demo: true
tables:
  - name: adult
    input: {data}
    schema: adult
    epsilon: 1.5
    columns: [age, education, sex, income]
    formats: [csv]
reports: {{target: income}}
"""


def _release(root: Path, text: str, suffix: str) -> tuple[int, Path]:
    root.mkdir()
    data = root / f"in.{suffix}"
    data.write_text(text, encoding="utf-8")
    (root / "rel.yaml").write_text(_RELEASE.format(root=root, data=data), encoding="utf-8")
    rc = main(["release", str(root / "rel.yaml"), "--runner=DirectRunner"])
    return rc, root / "rel" / "small"


def _jsonl(header: str, lines: list[str]) -> str:
    names = header.split(",")
    return "".join(json.dumps(dict(zip(names, line.split(",")))) + "\n" for line in lines)


@needs_adult
@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_release_publishes_the_same_with_one_malformed_line_more(tmp_path: Path, fmt: str) -> None:
    """Neighbours D (100 Adult rows) and D + one malformed line (CSV: a 17th field; JSONL: not
    JSON). The line is a dead letter, so the used records and, with the same seed, every public
    file must be identical (up to the release id and time); before the fix D + line failed
    (exit 2, nothing published) in the private report's pandas read."""
    header, rows = _adult_lines(100)
    if fmt == "csv":
        base = header + "\n" + "".join(r + "\n" for r in rows)
        extra = rows[0] + ",EXTRA\n"
    else:
        base = _jsonl(header, rows)
        extra = '{"age": 39, "sex": "Male"\n'
    rc_d, rel_d = _release(tmp_path / "d", base, fmt)
    rc_d1, rel_d1 = _release(tmp_path / "d1", base + extra, fmt)
    assert (rc_d, rc_d1) == (0, 0), "whether the release happens depends on one malformed line"
    pub_d = {k: _RUN_IDS.sub(b"X", v) for k, v in _files(rel_d).items() if not k.startswith("private/")}
    pub_d1 = {k: _RUN_IDS.sub(b"X", v) for k, v in _files(rel_d1).items() if not k.startswith("private/")}
    assert pub_d.keys() == pub_d1.keys() and "public/report.html" in pub_d
    assert [k for k in pub_d if pub_d[k] != pub_d1[k]] == []
    private = (rel_d1 / "private" / "report.html").read_text(encoding="utf-8")
    assert "Real rows compared: 100 (1 outside the declared domains dropped)" in private
