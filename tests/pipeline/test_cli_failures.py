"""Whole-file problems fail the CLI with status 2 before anything is spent or written; partial
rejections warn on the console; counts are honest (issue 19, items 1, 3, 4, 5 and part of 6).

Every case runs the CLI in-process as a user does, with progress output on (no ``--quiet``),
and checks the exit status, the message on stderr and that no output, dead-letter file or
manifest was written. Most cases fail in pre-flight, before a pipeline is built (fast); three run
a pipeline on tiny files.
"""

import gzip
import json
import os
import sys
from pathlib import Path

import pandas as pd
import pytest

from beamsynth.pipelines.cli import console
from beamsynth.pipelines.cli.main import main
from beamsynth.pipelines.io import preflight

ADULT = Path(__file__).resolve().parents[2] / "examples" / "data" / "adult" / "adult.csv"
LINES = ADULT.read_text(encoding="utf-8").splitlines()
HEADER = LINES[0]


def _csv(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def _synth(inp, out, *extra):
    return main(["synthesize", str(inp), "--schema", "adult", "--epsilon", "1", "--output", str(out),
                 "--seed", "1", *extra])


def _nothing_written(out: Path) -> None:
    left = sorted(p.name for p in out.parent.iterdir() if p.name.startswith(out.name)
                  or p.name.startswith(".beamsynth-temp"))
    assert left == [], left


def _error(capsys) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "error:" in line]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


@pytest.fixture()
def out(tmp_path):
    d = tmp_path / "out"
    d.mkdir()
    return d / "synthetic.csv"


# -- item 1: whole-file problems -------------------------------------------------------------------------
def test_missing_declared_column(tmp_path, out, capsys):
    inp = _csv(tmp_path / "noage.csv", [line.split(",", 1)[1] for line in LINES[:21]])
    assert _synth(inp, out) == 2
    assert _error(capsys) == (
        f"beamsynth synthesize: error: {inp}: header has no column 'age' (declared in schema 'adult'); "
        "header columns (15): 'workclass', 'fnlwgt', 'education', 'education-num', 'marital-status', "
        "'occupation', 'relationship', 'race', 'sex', 'capital-gain', 'capital-loss', 'hours-per-week', "
        "'native-country', 'income', 'split'")
    _nothing_written(out)


def test_semicolon_delimiter_is_named(tmp_path, out, capsys):
    inp = _csv(tmp_path / "semi.csv", [line.replace(",", ";") for line in LINES[:21]])
    assert _synth(inp, out) == 2
    msg = _error(capsys)
    assert msg.startswith(f"beamsynth synthesize: error: {inp}: header has no columns 'age', 'workclass', ")
    assert "(15 in all) (declared in schema 'adult'); header columns (1): 'age;workclass;" in msg
    assert msg.endswith(" — is the delimiter ';'? (beamsynth reads ','-separated CSV; convert the file)")
    _nothing_written(out)


def test_privacy_id_naming_no_column(tmp_path, out, capsys):
    inp = _csv(tmp_path / "a.csv", LINES[:21])
    assert _synth(inp, out, "--privacy-id", "person") == 2
    msg = _error(capsys)
    assert msg.startswith(f"beamsynth synthesize: error: {inp}: header has no column 'person' "
                          "(named by --privacy-id); header columns (16): 'age', ")
    _nothing_written(out)


def test_near_miss_column_name_is_suggested(tmp_path, out, capsys):
    inp = _csv(tmp_path / "a.csv", ["Age" + LINES[0][3:]] + LINES[1:5])
    assert _synth(inp, out) == 2
    assert _error(capsys).endswith("; did you mean 'Age' for 'age'?")


@pytest.mark.parametrize("name, content, problem", [
    ("empty.csv", b"", "the file is empty (no header line); a CSV input needs a header naming its columns"),
    ("utf16.csv", HEADER.encode("utf-16"), "the file is UTF-16 encoded; beamsynth reads UTF-8 — convert "
                                           "it (e.g. iconv -f utf-16 -t utf-8)"),
    ("latin1.csv", ("âge" + HEADER[3:] + "\n").encode("latin-1"),
     "the header line is not valid UTF-8 (byte 0xe2 at offset 0); beamsynth reads UTF-8 — convert the "
     "file (e.g. iconv -f latin1 -t utf-8)"),
    ("binary.csv", b"PAR1\x00\x00\x15\x04", "the file holds NUL bytes: is it a binary file (Parquet, "
                                           "Avro, a spreadsheet) with a .csv name?"),
    ("bad.avro", b"not avro at all", None),
    ("bad.parquet", b"not parquet", None),
])
def test_unreadable_files(tmp_path, out, capsys, name, content, problem):
    inp = tmp_path / name
    inp.write_bytes(content)
    assert _synth(inp, out) == 2
    msg = _error(capsys)
    if problem is None:
        kind = "Avro" if name.endswith(".avro") else "Parquet"
        assert msg.startswith(f"beamsynth synthesize: error: {inp}: not a readable {kind} file (")
    else:
        assert msg == f"beamsynth synthesize: error: {inp}: {problem}"
    _nothing_written(out)


def test_truncated_gzip(tmp_path, out, capsys):
    whole = gzip.compress(("\n".join(LINES[:3000]) + "\n").encode())
    inp = tmp_path / "cut.csv.gz"
    inp.write_bytes(whole[: len(whole) * 2 // 3])
    assert _synth(inp, out) == 2
    assert _error(capsys) == (
        f"beamsynth synthesize: error: {inp}: the gzip stream is truncated (it ends before its "
        "end-of-stream marker): the file was cut short; re-copy it")
    _nothing_written(out)
    # the intact file and a two-member gzip pass the check
    inp.write_bytes(whole + gzip.compress(b""))
    assert preflight.check_inputs(str(inp)).files[0].has_records is True


def test_no_input_matches(tmp_path, out, capsys):
    assert _synth(tmp_path / "nothing-*.csv", out) == 2
    assert _error(capsys) == f"beamsynth synthesize: error: {tmp_path}/nothing-*.csv: no input file matches"


@pytest.mark.parametrize("fmt", ["csv", "jsonl", "jsonl-unicode-space", "parquet"])
def test_header_only_input_is_refused(tmp_path, out, capsys, fmt):
    inp = tmp_path / f"empty.{fmt.split('-')[0]}"
    if fmt == "csv":
        _csv(inp, [HEADER, ""])
    elif fmt == "jsonl":
        inp.write_bytes(b"\n")
    elif fmt == "jsonl-unicode-space":  # lines the JSONL reader skips as blank (str.strip)
        inp.write_text("\u00a0\n\u2028 \n\u3000\n", encoding="utf-8")
    else:
        pd.DataFrame({c: pd.Series([], dtype=str) for c in HEADER.split(",")}).to_parquet(inp)
    assert _synth(inp, out) == 2
    assert _error(capsys) == (
        f"beamsynth synthesize: error: {inp}: no data records (the input is empty or header-only). An "
        "empty input is treated as an operator error; pass --allow-empty to release from it anyway "
        "(docs/methods.md, 'Empty inputs')")
    _nothing_written(out)


def test_one_empty_file_among_others_only_warns(tmp_path):
    (tmp_path / "in").mkdir()
    _csv(tmp_path / "in" / "a.csv", LINES[:5])
    _csv(tmp_path / "in" / "b.csv", LINES[:1])
    report = preflight.check_inputs(str(tmp_path / "in" / "*.csv"))
    assert report.warnings == [f"{tmp_path}/in/b.csv: no data records"]


def test_extra_columns_reject_and_avro_header(tmp_path):
    import fastavro

    from beamsynth.schemas.schema import load_schema

    schema = load_schema("adult")
    avro = tmp_path / "a.avro"
    fields = [{"name": "age", "type": "string"}, {"name": "person", "type": "string"}]
    with avro.open("wb") as fh:
        fastavro.writer(fh, {"type": "record", "name": "r", "fields": fields}, [{"age": "1", "person": "x"}])
    with pytest.raises(preflight.PreflightError, match=r"a\.avro: header has no columns 'workclass'"):
        preflight.check_inputs(str(avro), required=preflight.schema_requirements(schema))
    with pytest.raises(preflight.PreflightError,
                       match=r"header has undeclared column\(s\) \['person'\] and the schema says"):
        preflight.check_inputs(str(avro), required=[preflight.Required("age", "x")], reject_extra=["age"])


def test_prefixes_and_histogram_wrong_column(tmp_path, out, capsys):
    inp = _csv(tmp_path / "names.csv", ["name,pid", "smith,1", "jones,2"])
    assert main(["prefixes", str(inp), "--column", "surname", "--epsilon", "1", "--output", str(out)]) == 2
    assert _error(capsys) == (f"beamsynth prefixes: error: {inp}: header has no column 'surname' (named "
                              "by --column); header columns (2): 'name', 'pid'")
    assert main(["histogram", str(inp), "--column", "surname", "--domain", "list:smith,jones",
                 "--tolerance", "0.1", "--epsilon", "1", "--output", str(out)]) == 2
    assert _error(capsys) == (f"beamsynth histogram: error: {inp}: header has no column 'surname' (named "
                              "by --column); header columns (2): 'name', 'pid'")
    _nothing_written(out)


# -- item 6 (part): noise scales at build time, a closed stdout ------------------------------------------
def test_tiny_epsilon_refused_when_built(tmp_path, out, capsys, monkeypatch):
    from beamsynth.pipelines.io import read as bio

    def explode(*a, **k):
        raise AssertionError("data was read")

    monkeypatch.setattr(bio, "iter_raw_blocks", explode)
    inp = _csv(tmp_path / "a.csv", LINES[:21])
    assert main(["synthesize", str(inp), "--schema", "adult", "--epsilon", "1e-20",
                 "--output", str(out)]) == 2
    assert _error(capsys) == (
        "beamsynth synthesize: error: step 'row_count': ε=5e-22 gives noise scale=2e+21, which the "
        "exact samplers cannot draw (exp(-1/scale) rounds to 1); raise --epsilon")
    assert main(["synthesize", str(inp), "--schema", "adult", "--epsilon", "1e-20", "--rows", "5",
                 "--method", "privbayes", "--output", str(out)]) == 2
    assert _error(capsys).startswith("beamsynth synthesize: error: step 'privbayes.")
    _nothing_written(out)


def test_tiny_epsilon_histogram_and_prefixes(tmp_path, out, capsys):
    inp = _csv(tmp_path / "names.csv", ["name,pid", "smith,1", "jones,2"])
    assert main(["histogram", str(inp), "--column", "name", "--domain", "list:smith,jones",
                 "--tolerance", "0.1", "--epsilon", "1e-20", "--output", str(out)]) == 2
    assert _error(capsys) == ("beamsynth histogram: error: step 'cathist.name': ε=1e-20 gives noise "
                              "scale=1e+20, which the exact samplers cannot draw (exp(-1/scale) rounds "
                              "to 1); raise --epsilon")
    assert main(["prefixes", str(inp), "--column", "name", "--epsilon", "1e-20", "--output", str(out)]) == 2
    # the improved method's tight calibration: ε₀ = 0.99·ε (scale 1/ε₀), threshold and discount 1
    assert _error(capsys).startswith("beamsynth prefixes: error: step 'prefixes/improved': ε=1e-20 gives "
                                     "noise scale=1.0101e+20, which the exact samplers cannot draw")
    _nothing_written(out)


def test_header_is_the_first_non_blank_line(tmp_path):
    inp = _csv(tmp_path / "a.csv", ["", "", "name,pid", "", "smith,1"])
    facts = preflight.check_inputs(str(inp)).files[0]
    assert facts.columns == ["name", "pid"] and facts.has_records is True
    _csv(inp, ["", "name,pid", "", ""])
    with pytest.raises(preflight.PreflightError, match="no data records"):
        preflight.check_inputs(str(inp))
    _csv(inp, ["", "name,pid", "", "  "])  # a line of spaces is a record (a dead letter), not blank
    assert preflight.check_inputs(str(inp)).files[0].has_records is True


def test_noise_scale_check_passes_ordinary_scales():
    preflight.check_noise_scales([{"step": "s", "epsilon": 1e-9, "details": {"scale": 1e9,
                                                                            "nested": {"scale_x": 2.0}}}])
    with pytest.raises(preflight.PreflightError, match=r"step 's': ε=1e-17 gives noise nested\.scale_x=1e\+17"):
        preflight.check_noise_scales([{"step": "s", "epsilon": 1e-17, "details": {"nested": {"scale_x": 1e17}}}])


def test_closed_stdout_is_not_a_traceback(monkeypatch):
    r, w = os.pipe()
    os.close(r)  # the reader (`beamsynth schema avro adult | head`) has gone away
    stdout = os.fdopen(w, "w")
    monkeypatch.setattr(sys, "stdout", stdout)
    try:
        assert main(["schema", "avro", "adult"]) == 1  # no BrokenPipeError traceback
        stdout.write("later writes go to /dev/null\n")
        stdout.flush()
    finally:
        stdout.close()


# -- items 3, 4, 5: rejections, honest counts, advice (three small pipelines) ---------------------------
@pytest.fixture(scope="module")
def half_bad(tmp_path_factory):
    """40 Adult rows, 10 with an age outside the domain, 4 rows per person."""
    rows = []
    for i, line in enumerate(LINES[1:41]):
        if i % 4 == 0:
            line = "250" + line[line.index(","):]
        rows.append(f"p{i // 4},{line}")
    return _csv(tmp_path_factory.mktemp("bad") / "bad.csv", ["person," + HEADER] + rows)


def test_rejection_warning_counts_and_advice(half_bad, out, capsys):
    # --fail-on-rejected 0.3: the counting pre-pass finds 25% and lets the run go on
    assert _synth(half_bad, out, "--privacy-id", "person", "--max-contributions", "2", "--rows", "30",
                  "--method", "privbayes", "--pb-sizing", "off", "--fail-on-rejected", "0.3") == 0
    err = capsys.readouterr().err
    assert ("beamsynth synthesize: note: --method privbayes with about 30 rows at ε=1 over 15 columns "
            "(n·ε ≈ 30 < 6000 = 400 per column): correlated methods need more data or budget; "
            "--method independent usually gives better marginals here (docs/methods.md, 'Choosing a "
            "method')") in err
    assert ("beamsynth synthesize: warning: 10 of 40 rows (25.0%) were rejected (more than "
            "--warn-rejected 0.05); the release is built from the rest. Top reasons:\n"
            "  10 × column 'age': value … is outside the declared integer domain [17, 99]  (e.g. "
            f"{half_bad}:line 2; {half_bad}:line 6; {half_bad}:line 10) — compare the declared domain "
            "(bounds, case, spelling, rounding of maxima) with the data dictionary\n"
            f"  all dead letters: {out}.rejected.jsonl\n") in err
    # 10 persons with 3 usable rows each, bound 2: 10 dropped, 20 used
    assert (f"  rows read 40, rejected 10, dropped by the contribution bound 10, used 20 → wrote 30 "
            f"synthetic rows to {out}") in err
    op = json.loads(Path(f"{out}.manifest.json").read_text())["operational"]
    assert (op["rows_read"], op["rows_rejected"], op["rows_dropped_by_bound"], op["rows_used"]) == (40, 10, 10, 20)


def test_fail_on_rejected(half_bad, out, capsys):
    assert _synth(half_bad, out, "--privacy-id", "person", "--fail-on-rejected", "0.2") == 2
    assert _error(capsys) == (
        f"beamsynth synthesize: error: {half_bad}: 10 of 40 rows (25.0%) would be rejected, more than "
        "--fail-on-rejected 0.2; nothing was released and no budget spent")
    _nothing_written(out)


def test_warning_threshold_is_the_option():
    op = {"rows_read": 40, "rows_rejected": 10}
    assert console.rejection_report(op, "/nonexistent.jsonl", warn=0.3) is None
    assert console.rejection_report(op, "/nonexistent.jsonl", warn=0.2).startswith(
        "warning: 10 of 40 rows (25.0%) were rejected (more than --warn-rejected 0.2)")
    assert console.count_line({"rows_read": 40, "rows_rejected": 10, "rows_dropped_by_bound": 20,
                                 "rows_used": 10}) == (
        "rows read 40, rejected 10, dropped by the contribution bound 20, used 10")


def test_allow_empty_releases_from_header_only(tmp_path, out, capsys):
    inp = _csv(tmp_path / "h.csv", [HEADER])
    assert _synth(inp, out, "--allow-empty") == 0
    err = capsys.readouterr().err
    assert "rows read 0, rejected 0, dropped by the contribution bound 0, used 0 → wrote" in err
    assert out.exists() and Path(f"{out}.manifest.json").exists()


@pytest.mark.parametrize("method, eps, rows, columns, advised", [
    ("independent", 1.0, 100, 15, False), ("privbayes", 1.0, 3000, 15, True),
    ("privbayes", 1.0, 6000, 15, False), ("sbhg", 0.5, 6107, 15, True), ("privbayes", 1.0, 6107, 25, True),
    ("plausible", 2.0, 3000, 15, False), ("privbayes", 1.0, None, 15, False),
])
def test_method_advice_rule(method, eps, rows, columns, advised):
    got = console.method_advice(method=method, epsilon=eps, rows=rows, columns=columns, sizing="off")
    assert (got is not None) == advised
    if method == "privbayes":  # --pb-sizing auto (the default) sizes its own model: no advice
        assert console.method_advice(method=method, epsilon=eps, rows=rows, columns=columns) is None
        assert console.method_advice(method=method, epsilon=eps, rows=rows, columns=columns,
                                     sizing="auto") is None


def test_plausible_suggestion_is_feasible(tmp_path, out, capsys):
    inp = _csv(tmp_path / "a.csv", LINES[:21])
    assert main(["synthesize", str(inp), "--schema", "adult", "--epsilon", "1", "--delta", "1e-6",
                 "--method", "plausible", "--rows", "6000", "--output", str(out)]) == 2
    msg = _error(capsys)
    # it used to suggest k=379944 plausible seeds, more records than a 6,000-row data set has
    assert "would fit with k=" not in msg
    assert msg.endswith(
        "; no feasible k gets there: k can be at most about 1800 (the seed share of a data set of about "
        "6000 records, as --rows 6000 requests), and with k=1800, t=531, γ=4, ε0=0.01788 the requested "
        "rows need a total ε ≥ 180.7; release fewer rows (--rows), or use --method independent or "
        "--method privbayes, whose cost does not grow with the rows released")
    _nothing_written(out)


def test_release_refuses_bad_input_and_spends_nothing(tmp_path, capsys):
    import sqlite3

    inp = _csv(tmp_path / "noage.csv", [line.split(",", 1)[1] for line in LINES[:21]])
    cfg = tmp_path / "night.yaml"
    cfg.write_text(f"""
name: nightly
folder: {tmp_path}/releases/night-{{date}}
budget: {{epsilon: 1.0}}
ledger: {{path: {tmp_path}/ledger.sqlite, policies: {{adult: {{epsilon: 5.0}}}}}}
seed: 7
demo: true
tables:
  - {{name: adult, source: adult, input: {inp}, schema: adult, method: independent, epsilon: 1.0}}
reports: {{private: false, public: false}}
""", encoding="utf-8")
    assert main(["release", str(cfg), "--date", "2026-01-01"]) == 2
    assert _error(capsys).startswith(f"beamsynth release: error: {inp}: header has no column 'age' "
                                     "(declared in schema 'adult'); header columns (15): ")
    assert not (tmp_path / "releases").exists()
    with sqlite3.connect(tmp_path / "ledger.sqlite") as con:  # the reservation was released
        assert [r[0] for r in con.execute("SELECT state FROM releases")] == ["aborted"]


def test_rejection_report_groups_reasons_without_values(tmp_path):
    dead = tmp_path / "out.csv.rejected.jsonl"
    recs = ([{"source": "in.jsonl", "row": i, "line": i, "reason": f"invalid JSON: Expecting value: line 1 "
              f"column {i} (char {i - 1})"} for i in range(1, 8)]
            + [{"source": "in.jsonl", "row": 9, "line": None, "reason": "column 'a': value 'x' is outside"}])
    dead.write_text("".join(json.dumps(r) + "\n" for r in recs), encoding="utf-8")
    report = console.rejection_report({"rows_read": 10, "rows_rejected": 8}, str(dead), top=2)
    assert report.splitlines()[1:] == [
        "  7 × invalid JSON: Expecting value: line … column … (char …)  (e.g. in.jsonl:line 1; in.jsonl:line 2; "
        "in.jsonl:line 3) — is the file JSON Lines (one object per line)?",
        "  1 × column 'a': value … is outside  (e.g. in.jsonl:row 9)",  # no hint for an unknown reason
        f"  all dead letters: {dead}"]


def test_tab_delimited_gets_only_the_delimiter_hint(tmp_path):
    inp = _csv(tmp_path / "t.csv", [HEADER.replace(",", "\t"), LINES[1].replace(",", "\t")])
    with pytest.raises(preflight.PreflightError) as err:
        preflight.check_inputs(str(inp), required=[preflight.Required("age", "x"), preflight.Required("sex", "x")])
    assert str(err.value).endswith("— is the delimiter tab? (beamsynth reads ','-separated CSV; convert the file)")


def test_bad_bytes_in_a_record_do_not_fail_the_run(tmp_path):
    """Only the header line is structure: a NUL or non-UTF-8 byte in a record is that record's
    problem (a dead letter), never a reason to refuse the whole input (rule 7)."""
    inp = tmp_path / "a.csv"
    inp.write_bytes((HEADER + "\n").encode() + b"39,\x00State-gov\n" + "40,Priv\xe9\n".encode("latin-1"))
    facts = preflight.check_inputs(str(inp), required=[preflight.Required("age", "x")]).files[0]
    assert facts.has_records is True and facts.columns[0] == "age"
