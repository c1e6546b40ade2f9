"""The privacy ledger is a local SQLite file whose path is validated (issue 17): ``beamsynth
ledger`` and ``beamsynth release`` refuse a ``gs://``-style (any ``scheme://``) ledger path with
exit 2 and a message naming it, before any data is read or any folder is made."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from beamsynth.pipelines.cli.main import main
from beamsynth.pipelines.releases.ledger import PrivacyLedger

ADULT = Path(__file__).resolve().parents[2] / "examples" / "data" / "adult" / "adult.csv"
REMOTE = ["gs://bucket/ledger.sqlite", "s3://bucket/l.sqlite", "file:///tmp/l.sqlite"]


@pytest.fixture
def cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    assert list(tmp_path.iterdir()) == [] or all(p.suffix == ".yaml" for p in tmp_path.iterdir()), \
        f"made local files or folders: {sorted(p.name for p in tmp_path.iterdir())}"


@pytest.mark.parametrize("path", REMOTE)
@pytest.mark.parametrize("action", ["show", "reconcile"])
def test_ledger_command_refuses_a_non_local_ledger(action, path, cwd, capsys):
    assert main(["ledger", action, path]) == 2
    err = capsys.readouterr().err
    assert f"beamsynth ledger: error: ledger ({path!r}) must be a local file path" in err


@pytest.mark.parametrize("path", REMOTE)
def test_privacy_ledger_refuses_a_non_local_path_before_making_folders(path, cwd):
    with pytest.raises(ValueError, match=r"ledger path \(.*\) must be a local file path: it is a "
                                         r"SQLite database"):
        PrivacyLedger(path)


@pytest.mark.parametrize("check", [False, True])
def test_release_refuses_a_non_local_ledger_before_reading_data(check, cwd, capsys, monkeypatch):
    """Exit 2 naming ``ledger.path``; the input (which does not exist) is never opened."""
    import builtins

    opened = []
    real_open = builtins.open
    monkeypatch.setattr(builtins, "open", lambda f, *a, **k: (opened.append(os.fspath(f)),
                                                               real_open(f, *a, **k))[1])
    config = cwd / "release.yaml"
    config.write_text("""
name: nightly
folder: out/nightly-{date}
budget: {epsilon: 1.0}
ledger: {path: "gs://bucket/ledger.sqlite", policies: {adult: {epsilon: 5}}}
tables:
  - {name: adult, input: no-such-input.csv, schema: adult, epsilon: 1.0}
""")
    assert main(["release", str(config), *(["--check"] if check else [])]) == 2
    err = capsys.readouterr().err
    assert "ledger.path: ('gs://bucket/ledger.sqlite') must be a local file" in err
    assert not [f for f in opened if "no-such-input" in f or f.endswith(".sqlite")]
