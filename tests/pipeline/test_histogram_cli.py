"""``beamsynth histogram``: output rows, dead letters, manifest, validation and empty input."""

import csv
import json

import pytest

from beamsynth.pipelines.cli.histogram import parse_domain
from beamsynth.pipelines.cli.main import main

WORDS = [f"w{i}" for i in range(500)]


@pytest.fixture()
def files(tmp_path):
    words = tmp_path / "words.txt"
    words.write_text("\n".join(WORDS) + "\n")
    data = tmp_path / "in.csv"
    rows = [("a", "w1")] * 400 + [("b", "w2")] * 250 + [("c", "not-a-word")] * 4 + [("d", "w3")] * 2
    with data.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["pid", "name"])
        w.writerows(rows)
    return tmp_path, words, data


def _read(path):
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def test_histogram_over_word_list(files):
    tmp, words, data = files
    out = tmp / "hist.csv"
    rc = main(["--quiet", "histogram", str(data), "--column", "name", "--domain", str(words),
               "--epsilon", "1", "--tolerance", "0.5", "--output", str(out), "--seed", "3"])
    assert rc == 0
    got = {r["name"]: int(r["count"]) for r in _read(out)}
    assert {"w1", "w2"} <= set(got) and set(got) <= set(WORDS)
    manifest = json.loads((tmp / "hist.csv.manifest.json").read_text())
    d = manifest["release"]["details"]
    assert d["domain_size"] == 500 and d["tolerance"] == 0.5 and d["tau"] >= 1
    assert all(v >= d["tau"] for v in got.values())
    assert manifest["release"]["budget"]["spent"]["epsilon"] == 1.0
    assert manifest["operational"]["rows_rejected"] == 4
    rejected = (tmp / "hist.csv.rejected.jsonl").read_text().splitlines()
    assert len(rejected) == 4 and "outside the declared" in rejected[0]


def test_pairs_domain_with_privacy_id(files):
    tmp, words, data = files
    out = tmp / "pairs.csv"
    rc = main(["--quiet", "histogram", str(data), "--column", "name", "--domain", f"pairs:{words}",
               "--epsilon", "1", "--tolerance", "0.9", "--output", str(out), "--seed", "4",
               "--privacy-id", "pid", "--max-contributions", "100"])
    assert rc == 0
    manifest = json.loads((tmp / "pairs.csv.manifest.json").read_text())
    assert manifest["release"]["details"]["domain_size"] == 500**2
    assert manifest["release"]["details"]["scale"] == pytest.approx(100.0)
    # single words are not pairs: every row is rejected; the release is random bins only
    assert manifest["operational"]["rows_rejected"] == 656
    assert all(len(r["name"].split(" ")) == 2 for r in _read(out))


def test_empty_input_still_releases(files):
    tmp, words, _ = files
    empty = tmp / "empty.csv"
    empty.write_text("name\n")
    out = tmp / "empty_out.csv"
    rc = main(["--quiet", "histogram", str(empty), "--column", "name", "--domain", f"words:{words}",
               "--epsilon", "0.5", "--tolerance", "0.1", "--output", str(out), "--seed", "5",
               "--allow-empty"])  # without it an empty input is refused (docs/methods.md)
    assert rc == 0
    manifest = json.loads((tmp / "empty_out.csv.manifest.json").read_text())
    assert manifest["release"]["rows_out"] == len(_read(out))


@pytest.mark.parametrize("args,message", [
    # flags out of range are refused while parsing, naming the flag (argparse's exit 2; H101)
    (["--tolerance", "1.0"], "argument --tolerance: '1.0' is not a finite number in (0, 1)"),
    (["--tolerance", "0"], "argument --tolerance: '0' is not a finite number in (0, 1)"),
    (["--tolerance", "0.5", "--epsilon", "0"], "argument --epsilon: '0' is not a finite number > 0"),
    (["--tolerance", "0.5", "--max-contributions", "3"], "needs --privacy-id"),
])
def test_validation_errors(files, capsys, args, message):
    tmp, words, data = files
    base = ["histogram", str(data), "--column", "name", "--domain", str(words),
            "--output", str(tmp / "x.csv")]
    if "--epsilon" not in args:
        base += ["--epsilon", "1"]
    try:
        code = main(base + args)
    except SystemExit as exc:  # argparse's refusal
        code = exc.code
    assert code == 2
    assert message in capsys.readouterr().err


def test_domain_specs(tmp_path):
    assert parse_domain("int:-5:5", column="x").domain.size == 11
    assert parse_domain("string:ab:1:3", column="x").domain.size == 2 + 4 + 8
    assert parse_domain("list:a,b,c", column="x").domain.size == 3
    schema = tmp_path / "s.yaml"
    schema.write_text("name: s\ncolumns:\n- name: c\n  type: categorical\n  open: {tolerance: 0.3}\n"
                      "  domain: {kind: string, alphabet: abc, min_length: 1, max_length: 4}\n")
    col = parse_domain(f"{schema}:c", column="other")
    assert col.name == "other" and col.tolerance == 0.3 and col.domain.size == 3 + 9 + 27 + 81
    with pytest.raises(ValueError, match="not an existing file nor one of the forms"):
        parse_domain("nope:nothing", column="x")
