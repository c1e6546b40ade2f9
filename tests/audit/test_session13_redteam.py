"""Session 13 red team (H45): the twelfth session's changes (6afdca7..5cc3cae) against the privacy
rules, with neighbour pairs through the real entry points. Each test failed on the code before its
fix.

1. Beam YAML ``ReadFromJson`` (or ``ReadFromCsv``) → ``BeamsynthSynthesize`` (rule 6). Beam reads
   the file with pandas, so an integer code column holding one null becomes a float column in the
   chunk holding it (1 → 1.0). The YAML step turned every value into its text before encoding, so
   a categorical code ``1.0`` was ``'1.0'``, outside the declared ``["1", "2", "3"]``: adding one
   record that lacks ``code`` rejected **every other record** of its chunk. Neighbours D (300
   records, ``code`` 1..3) and D + ``{"n": 999}`` (first or last line): 300 vs 0 rows used, 0 vs 301
   rejected. The API's encoder had been fixed for this in d5b3cea (a whole float whose own text is
   not declared is its integer code); the YAML step's rows now keep such floats, so the same rule
   judges them (D + record: 300 used, 1 rejected).
   The same held for the privacy id (rule 5): ids written ``7`` in one file and ``7.0`` in another
   (pandas, a file holding one record without ``pid``) were two persons. Neighbours D (files a, b:
   persons 0..99 once each, max_contributions 1) and D + ``{"code": 3}`` in file a: 100 vs 200
   rows used (the bound held per spelling); now 100 and 100, as ``job.private`` (654be4e).
2. The declared target's star (5b201ed, b8b3ed3), found clean and kept as audits: every draw of
   a star measurement (DP count under Laplace and zCDP plans, m = 1, 2; public rows) fits the
   accountant's spends (Σ pure ε = 0.98 = ε − ε_c, or 1.0 with public rows), and the star is a
   function of the DP count only: D (1,017 records) and D − 1 given the same n̂ and seed release
   the same structure, tables, scales and noise (fails when the star is planned from the exact
   count, and the spend check when the star gets 1.02 ε).
3. ``schema draft`` (4765fef, rule 1): a pandas table of distinct-text columns (names, e-mails)
   and a one-record ``orient="index"`` table still drafted (row numbers as categories, values in
   REVIEW notes); refused now.
4. ``job.private``'s refusal of typed rows without any field it reads (4b709eb; YAML twin
   c7a9d7b; lacking a required field, 77a7d72) was data-dependent when Beam infers the type from
   the records (``ReadFromJson``, ``Create``): D (50 records without ``code``) was refused when
   built, D + ``{"code": 1}`` released (rule 7). Now a build-time warning on both sides.
5. Codes with leading zeros through pandas readers (rule 6, API and YAML): ``beam.io.ReadFromCsv``
   reads a code column ``01, 02, 03`` as the numbers 1, 2, 3 unless one value is no number, so D
   (300 rows) had all 300 rows rejected and D + the row ``x1,5`` used them. A number whose text
   is not declared is now the one declared category of its value (``schemas/schema.py``).
"""

from __future__ import annotations

import glob
import json
from pathlib import Path

import apache_beam as beam
import numpy as np
import pytest

pytestmark = pytest.mark.audit

CODES = {"name": "codes", "columns": [
    {"name": "code", "type": "categorical",
     "domain": {"kind": "categorical", "values": ["1", "2", "3"]}},
    {"name": "n", "type": "integer", "domain": {"kind": "integer", "low": 0, "high": 1000}}]}


PERSONS = {"name": "persons", "privacy_id": "pid", "columns": [
    {"name": "code", "type": "categorical",
     "domain": {"kind": "categorical", "values": ["1", "2", "3"]}}]}


def _run_yaml(tmp_path: Path, path: str, schema: dict, extra: str = "") -> dict:
    """``ReadFromJson(path)`` → ``BeamsynthSynthesize`` (seeded, manifest) → ``WriteToJson``; the
    manifest."""
    pytest.importorskip("apache_beam.yaml.main")
    from tests.yaml_helpers import provider, run_yaml

    schema_file = tmp_path / "schema.json"
    schema_file.write_text(json.dumps(schema), encoding="utf-8")
    out, manifest = tmp_path / "out", tmp_path / "manifest.json"
    errors = ", error_handling: {output: bad}" if extra else ""
    run_yaml(tmp_path / "job.yaml", f"""providers:
  - include: {provider()}
pipeline:
  transforms:
    - {{type: {"ReadFromCsv" if path.endswith(".csv") else "ReadFromJson"}, name: Read, config: {{path: "{path}"}}}}
    - type: BeamsynthSynthesize
      name: Synth
      input: Read
      config: {{schema: "{schema_file}", epsilon: 0.5, rows: 10, seed: 1, manifest: "{manifest}",
                max_contributions: 1{errors}}}
    - {{type: WriteToJson, input: {"Synth.output" if extra else "Synth"}, config: {{path: "{out}"}}}}
{extra}""")
    return json.loads(manifest.read_text(encoding="utf-8"))


def _find(obj, key):
    """The first value of ``key`` anywhere in a nested manifest."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            if k == key:
                return v
            found = _find(v, key)
            if found is not None:
                return found
    return None


# -- 1. one record must not change how the others encode (YAML step, pandas readers) --------------
def test_yaml_rows_with_whole_float_codes_encode_as_the_api_does(tmp_path: Path) -> None:
    """The step's encoder alone: a code ``1.0`` (pandas' form of 1 in a column with a null) is the
    declared ``"1"``, as in ``job.private``; a declared ``"1.0"`` still matches itself."""
    from beamsynth.pipelines.yaml_transforms import encode_rows
    from beamsynth.schemas.schema import load_schema

    schema = load_schema(CODES)
    batch, bad = encode_rows(schema, [beam.Row(code=1.0, n=5.0), beam.Row(code=3, n=7),
                                      beam.Row(code=2.5, n=1)])
    assert [b.reason for b in bad] == [
        "column 'code': value 2.5 is outside the declared categorical domain (to keep such rows, declare a catch-all cell, other: OTHER in the domain, and on_out_of_domain: other; docs/schema-format.md)"]
    assert batch.codes[:, 0].tolist() == [0, 2]
    floats = load_schema({"name": "f", "columns": [
        {"name": "code", "type": "categorical",
         "domain": {"kind": "categorical", "values": ["1", "1.0"]}}]})
    batch, bad = encode_rows(floats, [beam.Row(code=1.0), beam.Row(code=1)])
    assert not bad and batch.codes[:, 0].tolist() == [1, 0]


@pytest.mark.parametrize("where", ["first", "last"])
def test_yaml_one_record_lacking_a_code_leaves_the_others_used(tmp_path: Path, where: str) -> None:
    """Neighbours D (300 JSON lines) and D + one line lacking ``code``, through YAML's
    ``ReadFromJson`` and the step: D + line must use D's 300 records and reject that one (it
    used 0 and rejected 301)."""
    records = [{"code": i % 3 + 1, "n": i} for i in range(300)]
    records = [{"n": 999}] + records if where == "first" else records + [{"n": 999}]
    data = tmp_path / "in.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    out = tmp_path / "out"
    m = _run_yaml(tmp_path, str(data), CODES, extra=(
        f'    - {{type: WriteToJson, input: Synth.bad, config: {{path: "{out}.bad"}}}}\n'))
    assert (_find(m, "rows_read"), _find(m, "rows_used"), _find(m, "rows_rejected")) == (301, 300, 1)
    bad = [json.loads(line) for p in sorted(glob.glob(f"{out}.bad*")) for line in open(p)]
    assert [b["reason"] for b in bad] == ["column 'code': null in a non-nullable column"]


def test_yaml_privacy_ids_as_whole_floats_are_one_person() -> None:
    """The step's encoder alone: ids 7, "7" and 7.0 are one person (as job.private)."""
    from beamsynth.pipelines.yaml_transforms import encode_rows
    from beamsynth.schemas.schema import load_schema

    batch, bad = encode_rows(load_schema(PERSONS), [beam.Row(pid=7.0, code="1"),
                                                    beam.Row(pid=7, code="2"),
                                                    beam.Row(pid="7", code="3")])
    assert not bad and batch.pids.tolist() == ["7", "7", "7"]


def test_yaml_one_record_lacking_an_id_keeps_the_contribution_bound(tmp_path: Path) -> None:
    """Neighbours D (files a and b: persons 0..99 once each; m = 1) and D + one record without
    ``pid`` in file a, through YAML's ``ReadFromJson``: both must use 100 records (D + record
    used 200: file a's ids became 0.0 .. 99.0, a second person each)."""
    for name, code in (("a", 1), ("b", 2)):
        recs = [{"pid": i, "code": code} for i in range(100)] + ([{"code": 3}] if name == "a" else [])
        (tmp_path / f"in_{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs),
                                                  encoding="utf-8")
    m = _run_yaml(tmp_path, f"{tmp_path}/in_*.jsonl", PERSONS)
    assert (_find(m, "rows_read"), _find(m, "rows_used"), _find(m, "rows_rejected"),
            _find(m, "rows_dropped_by_bound")) == (201, 100, 1, 100)


# -- 2. the declared target's star (5b201ed, b8b3ed3): spends and data-independence ---------------
# Adult's declared cells, target income (2 cells): at ε = 1 the DP count picks k = 0 below ~3,900
# rows and the star's columns grow with n̂ (1,016 rows: 7 columns... 1,017: 8 with column 10).
STAR_N = 1017


def _star_plan(noise_mode: str, m: int, rows: int | None):
    from beamsynth.transforms.budget import ApproxDP, PrivacyAccountant
    from beamsynth.transforms.privbayes import gaussian_plan, plan_privbayes, spend_privbayes
    from tests.audit.test_session12_accounting import DELTA, EPS, SHAPE

    budget = ApproxDP(epsilon=EPS, delta=DELTA if noise_mode == "gaussian" else 0.0)
    plan = plan_privbayes(SHAPE, budget, sizing="auto", rows=rows, max_contributions=m,
                          target=len(SHAPE) - 1, names=[f"c{i}" for i in range(len(SHAPE))])
    if noise_mode == "gaussian":
        plan = gaussian_plan(plan, budget)
    acc = PrivacyAccountant(total=budget)
    spend_privbayes(acc, plan)
    return plan, {s["step"]: s for s in acc.to_dict()["spends"]}, acc


def _measure(plan, codes, rs_seed: int = 0):
    from beamsynth.transforms.noise import RandomSource
    from beamsynth.transforms.privbayes import measure_privbayes
    from tests.audit.test_session12_accounting import SHAPE, _counts

    fams, counts = _counts(plan, codes)
    return measure_privbayes(counts, fams, shape=SHAPE, names=[f"c{i}" for i in range(len(SHAPE))],
                             plan=plan, rs=RandomSource(seed=rs_seed)), counts


@pytest.mark.parametrize(("noise_mode", "m", "rows"), [
    ("laplace", 1, None), ("laplace", 2, None), ("gaussian", 1, None), ("gaussian", 2, None),
    ("laplace", 1, STAR_N), ("gaussian", 1, STAR_N)])
def test_star_draws_fit_the_spends(monkeypatch, noise_mode, m, rows):
    """Every privacy draw of one star measurement (recorded in every beamsynth module) against
    the accountant: the size count within privbayes.size_count, the star's discrete Laplace
    tables within the rest (pure Σ m/b ≤ ε − ε_c, or ≤ ε with public rows; under a zCDP plan the
    pure ε − ε_c is within privbayes.zcdp's (ε − ε_c, δ)). Measured: Σ = 0.98 (DP count), 1.00
    (public rows), m = 1, 2."""
    from tests.audit.test_session12_accounting import SHAPE, _codes, record_draws, verdict

    plan, spends, acc = _star_plan(noise_mode, m, rows)
    calls = record_draws(monkeypatch)
    out, _ = _measure(plan, _codes(STAR_N, 0))
    assert out.structure[0] == (len(SHAPE) - 1, ())  # the star: T first, then X | T
    assert any(ps == (len(SHAPE) - 1,) for _, ps in out.structure[1:])
    rest = spends.get("privbayes.zcdp") or {
        "epsilon": acc.spent_epsilon - spends.get("privbayes.size_count", {}).get("epsilon", 0.0),
        "delta": acc.spent_delta}
    v = verdict(calls, m=m, count=spends.get("privbayes.size_count"), rest=rest)
    assert v["ok"] and v["gaussian"] == 0, v
    assert v["pure"] == pytest.approx(0.98 if rows is None else 1.0, rel=1e-9)


@pytest.mark.parametrize("noise_mode", ["laplace", "gaussian"])
def test_star_is_a_function_of_the_dp_count_only(monkeypatch, noise_mode):
    """Coupling check of the star's privacy argument: D (1,017 records) and D − its last record
    (1,016: at public n the star would differ, column c10 joins at 1,017), both given the same
    DP count n̂ (the size count's noise set to n̂ − exact) and the same seed. Everything but the
    tables' exact counts must match: structure, released tables, their scales and budgets, and
    the tables' noise (noisy − exact identical). A star chosen from the exact count fails here."""
    from beamsynth.transforms import privbayes_measure as pbm
    from beamsynth.transforms.privbayes_structure import _family_table
    from tests.audit.test_session12_accounting import _codes, _counts

    plan, _, _ = _star_plan(noise_mode, 1, None)
    codes = _codes(STAR_N, 0)
    real = pbm.discrete_laplace
    got = []
    for data in (codes, codes[:-1]):
        exact = len(data)

        def fixed(rs, scale, size, _exact=exact):
            if rs.labels and rs.labels[-1] == "size_count":
                return np.asarray([1100 - _exact])  # n̂ = 1,100 on both sides
            return real(rs, scale, size)

        monkeypatch.setattr(pbm, "discrete_laplace", fixed)
        out, counts = _measure(plan, data)
        fams, _ = _counts(plan, data)
        tables = {tuple(f): np.asarray(c) for f, c in zip(fams, counts)}
        noise = [np.asarray(mm.values) - _family_table(tables, tuple(mm.columns))
                 for mm in out.marginals]
        got.append((out.structure, [(mm.columns, mm.scale, mm.budget) for mm in out.marginals],
                    out.sizing, noise))
    (s0, t0, z0, n0), (s1, t1, z1, n1) = got
    assert s0 == s1 and t0 == t1 and z0 == z1
    assert z0["rows_hat"] == 1100 and z0["star_columns"] >= 8
    assert all(np.array_equal(a, b) for a, b in zip(n0, n1))


# -- 3. schema draft: data tables that still drafted after 4765fef ---------------------------------
@pytest.mark.parametrize("rows", [40, 41])
def test_schema_draft_refuses_a_table_of_distinct_text_columns(tmp_path: Path, capsys, rows: int):
    """pandas' ``to_json()`` of a table whose columns hold distinct text (names, e-mails) has the
    ``{column: {row: label}}`` shape with every column keyed ``"0" .. "n-1"``: no value repeats
    and none is a number, so 4765fef's rule drafted it, categories ``"0" .. "39"`` (D) and
    ``"0" .. "40"`` (D + one row: the row count as a domain) with the first six names in a REVIEW
    note (rule 1). Two or more entries keyed by the same ``"0" .. "n-1"`` with n ≥ 3 are now a
    table, whatever the values."""
    import pandas as pd

    from beamsynth.pipelines.cli.main import main

    path = tmp_path / "people.json"
    path.write_text(pd.DataFrame({"name": [f"person{i}" for i in range(rows)],
                                  "email": [f"p{i}@example.org" for i in range(rows)]}).to_json(),
                    encoding="utf-8")
    assert main(["schema", "draft", str(path), "--output", str(tmp_path / "s.yaml")]) == 2
    err = capsys.readouterr().err
    assert "a table of records, not a dictionary" in err and "person" not in err
    assert not (tmp_path / "s.yaml").exists()


def test_schema_draft_refuses_a_one_record_table(tmp_path: Path, capsys):
    """``to_json(orient="index")`` of one record, ``{"0": {column: value}}``, drafted a column
    "0" whose categories were the column names and whose REVIEW note held the record's values
    (two records were refused: D and D + 1 differed). Top keys ``"0" .. "n-1"`` whose entries
    share their fields are a table for n = 1 too."""
    from beamsynth.pipelines.cli.main import main
    from beamsynth.pipelines.schema_draft import read_dictionary

    path = tmp_path / "one.json"
    path.write_text(json.dumps({"0": {"sex": "Male", "race": "White", "income": "<=50K"}}),
                    encoding="utf-8")
    assert main(["schema", "draft", str(path)]) == 2
    err = capsys.readouterr().err
    assert "a table of records, not a dictionary" in err and "Male" not in err
    shared = tmp_path / "binary.json"  # genuine: two yes/no columns sharing the codes 0/1
    shared.write_text(json.dumps({"smoker": {"0": "No", "1": "Yes"},
                                  "sex": {"0": "Female", "1": "Male"}}), encoding="utf-8")
    assert [c.spec["domain"]["values"] for c in read_dictionary(shared)[1]] == [["0", "1"]] * 2


# -- 4. the typed-rows check of 4b709eb / c7a9d7b must not depend on the data ----------------------
def _builds(rows_json: list[dict], tmp_path: Path) -> bool:
    """Whether ``beam.io.ReadFromJson(path) | job.private(schema)`` builds (Beam infers the rows'
    type from the records when the pipeline is built)."""
    import beamsynth as bs

    schema = bs.load_schema({"name": "codes", "columns": CODES["columns"][:1]})
    path = tmp_path / f"in{len(rows_json)}.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows_json), encoding="utf-8")
    p = beam.Pipeline()
    rows = p | f"Read{len(rows_json)}" >> beam.io.ReadFromJson(str(path))
    try:
        rows | f"Private{len(rows_json)}" >> bs.PrivacyJob(epsilon=1.0, seed=1).private(schema)
    except ValueError as exc:
        assert "none of the fields it reads" in str(exc)
        return False
    return True


def test_typed_rows_refusal_does_not_depend_on_the_records(tmp_path: Path) -> None:
    """Neighbours D (50 records {"note": ...}, none carrying ``code``) and D + {"code": 1}
    through ``beam.io.ReadFromJson``: D is refused when built, D + record builds and releases
    (measured: Count released, noisy_count 1). Whether a release happens must not depend on the
    records: both build, or both are refused."""
    base = [{"note": f"x{i}"} for i in range(50)]
    assert _builds(base, tmp_path) == _builds(base + [{"code": 1}], tmp_path)


# -- 5. codes with leading zeros through pandas readers (API and YAML ReadFromCsv) -----------------
ZERO = {"name": "zero", "columns": [
    {"name": "code", "type": "categorical",
     "domain": {"kind": "categorical", "values": ["01", "02", "03"]}},
    {"name": "n", "type": "integer", "domain": {"kind": "integer", "low": 0, "high": 1000}}]}


def test_numbers_match_the_one_declared_code_of_their_value() -> None:
    """The encoder alone: pandas' ReadFromCsv parses a code column "01", "02" as the numbers
    1, 2 unless one of its values is no number; a number whose text is not declared is the one
    declared category of the same value ("01" for 1, "1.50" for 1.5); two such categories
    ("1", "01" both declared: text wins; "01", "001": none) leave it to its own text."""
    import numpy as np

    from beamsynth.schemas.schema import load_schema

    col = load_schema(ZERO).columns[0]
    codes, why = col.encode([1, np.int64(2), 3.0, "01", "1", 4])  # "1" too since H55 (as 1)
    assert codes[:5].tolist() == [0, 1, 2, 0, 0] and sorted(why) == [5]
    both = load_schema({"name": "b", "columns": [{"name": "c", "type": "categorical", "domain": {
        "kind": "categorical", "values": ["01", "001", "1.50", "7"]}}]}).columns[0]
    codes, why = both.encode([1, 1.5, 7, 7.0, True])
    assert codes[1:4].tolist() == [2, 3, 3] and sorted(why) == [0, 4]


def _zero_csv(tmp_path: Path, extra: list[str]) -> Path:
    path = tmp_path / f"in{len(extra)}.csv"
    path.write_text("code,n\n" + "".join(f"0{i % 3 + 1},{i}\n" for i in range(300))
                    + "".join(line + "\n" for line in extra), encoding="utf-8")
    return path


def test_api_read_from_csv_one_record_leaves_the_others_used(tmp_path: Path) -> None:
    """Neighbours through ``beam.io.ReadFromCsv`` → ``job.private``: D (300 rows, codes "01" ..
    "03": pandas reads 1 .. 3) and D + the row ``x1,5`` (the column stays text). D's 300 rows
    were all dead letters ('value 1 is outside the declared categorical domain') and D + row's
    300 were used: one row decided whether 300 others counted (rule 6)."""
    import beamsynth as bs

    schema = bs.load_schema(ZERO)
    dead = []
    for extra in ([], ["x1,5"]):
        job = bs.PrivacyJob(epsilon=1.0, seed=1)
        out = tmp_path / f"dead{len(extra)}"
        with beam.Pipeline() as p:
            priv = p | f"Read{len(extra)}" >> beam.io.ReadFromCsv(str(_zero_csv(tmp_path, extra))) \
                | job.private(schema)
            _ = priv.dead_letters | beam.Map(lambda r: r.reason) | beam.io.WriteToText(str(out))
            _ = priv | bs.Count(epsilon=0.5)
            _ = p | bs.WriteManifest(job=job, path=str(tmp_path / f"m{len(extra)}.json"))
        dead.append([line.strip() for f in glob.glob(f"{out}*") for line in open(f)])
    assert dead == [[], ["column 'code': value 'x1' is outside the declared categorical domain (to keep such rows, declare a catch-all cell, other: OTHER in the domain, and on_out_of_domain: other; docs/schema-format.md)"]]


def test_yaml_read_from_csv_codes_with_leading_zeros_are_used(tmp_path: Path) -> None:
    """The same through YAML's ``ReadFromCsv`` → ``BeamsynthSynthesize``: D's 300 rows are used
    (they were all rejected, while D + ``x1,5`` used them)."""
    m = _run_yaml(tmp_path, str(_zero_csv(tmp_path, [])), ZERO).copy()
    assert (_find(m, "rows_read"), _find(m, "rows_used"), _find(m, "rows_rejected")) == (300, 300, 0)


def test_yaml_typed_rows_check_does_not_depend_on_the_records(tmp_path: Path) -> None:
    """The YAML twin: ``ReadFromJson`` (schema inferred from the records) → BeamsynthSynthesize on
    D (40 records without ``code``) and D + {"code": 1}: both release, with the same number of
    synthetic rows and the used/rejected counts only in the private part."""
    schema = {"name": "codes", "columns": CODES["columns"][:1]}
    base = [{"note": f"x{i}"} for i in range(40)]
    manifests = []
    for name, records in (("d", base), ("d1", base + [{"code": 1}])):
        folder = tmp_path / name
        folder.mkdir()
        path = folder / "in.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
        manifests.append(_run_yaml(folder, str(path), schema))
    assert [_find(m, "rows_used") for m in manifests] == [0, 1]
    assert _find(manifests[0], "rows_out") == _find(manifests[1], "rows_out") == 10
