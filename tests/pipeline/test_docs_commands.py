"""The shell commands of the docs that read bundled samples run as written from a clone.

Each ``beamsynth ...`` command of a ```` ```bash ```` block that names ``examples/data/`` (or a file
an earlier command of the same block wrote) runs through the CLI from the repository root, with
``/tmp/`` and ``out/`` redirected into the test's temporary folder. Exit status must be 0.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pandas as pd
import pytest

from beamsynth.pipelines.cli.main import main
from beamsynth.pipelines.io.encode import encode_block
from beamsynth.pipelines.io.read import iter_raw_blocks
from beamsynth.schemas.schema import load_schema

ROOT = Path(__file__).resolve().parents[2]
_BLOCK = re.compile(r"```bash\n(.*?)```", re.S)


def commands(doc: str) -> list[list[str]]:
    """The ``beamsynth`` commands of a doc's bash blocks that read bundled samples."""
    text = (ROOT / "docs" / doc).read_text(encoding="utf-8")
    out = []
    for block in _BLOCK.findall(text):
        joined = block.replace("\\\n", " ")
        for line in joined.splitlines():
            line = line.strip()
            if line.startswith("beamsynth ") and ("examples/data/" in line or "/tmp/" in line):
                out.append(shlex.split(line)[1:])
    return out


def _run(argv: list[str], tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(ROOT)
    args = [a.replace("/tmp/", f"{tmp_path}/").replace("out/", f"{tmp_path}/out/")
            if not a.startswith("examples/") else a for a in argv]
    (tmp_path / "out").mkdir(exist_ok=True)
    assert main(args + ["--quiet"] if args[0] in ("synthesize", "histogram", "prefixes") else args) == 0, argv


def test_docs_name_only_bundled_samples():
    for doc in sorted((ROOT / "docs").glob("*.md")):
        assert "../shared/data" not in doc.read_text(encoding="utf-8"), doc.name


def test_schema_guide_commands(tmp_path, monkeypatch):
    cmds = commands("schema-guide.md")
    assert [c[:2] for c in cmds] == [["schema", "draft"], ["schema", "validate"],
                                    ["synthesize", "examples/data/acs_nist_sdnist/national2019_2k.csv"]]
    for argv in cmds:
        _run(argv, tmp_path, monkeypatch)
    # issue 19 item 2 on real nulls: the synthetic file reads back with its own schema
    schema = load_schema(tmp_path / "acs.yaml")
    synthetic = tmp_path / "acs_synthetic.csv"
    used, rejected = 0, []
    for item in iter_raw_blocks(str(synthetic)):
        batch, bad = encode_block(schema, item)
        used, rejected = used + len(batch), rejected + bad
    assert rejected == [] and used > 1000
    frame = pd.read_csv(synthetic, dtype=str, keep_default_na=False)
    assert not frame["PINCP"].str.contains(r"\.").any()  # integers, never 15400.0
    nullable = [c.name for c in schema.columns if c.nullable]
    assert len(nullable) == 11 and all("" not in set(frame[c]) for c in nullable)
    # nulls are written as the declared token N (sampled: some of the 11 columns hold nulls)
    assert sum(int((frame[c] == "N").sum()) for c in nullable) > 0


@pytest.mark.slow
@pytest.mark.parametrize("doc", ["cathist.md", "prefixes.md"])
def test_mechanism_doc_commands(doc, tmp_path, monkeypatch):
    cmds = commands(doc)
    assert cmds, doc
    for argv in cmds:
        _run(argv, tmp_path, monkeypatch)
