"""What a user sees on the terminal from `beamsynth synthesize` with progress on: a few row-count
lines that only go up (per process: direct-multi's and Dask's workers each count their own rows,
tagged [worker PID]), no SDK worker INFO chatter, and nothing at all with --quiet."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from beamsynth.pipelines.cli.main import main
from tests.pipeline import test_cli_synthesize

adult_sample = test_cli_synthesize.adult_sample  # fixture: 3,000 Adult rows

LINE = re.compile(r"synthesize(?: \[worker (\d+)\])?: rows used (\d+) so far$")


def _synthesize(path: Path, out: Path, runner: str, *extra: str) -> int:
    """Read in ~16 parts (--split-bytes), so the rows arrive in many batches."""
    return main(["synthesize", str(path), "--schema", "adult", "--epsilon", "1", "--rows", "100",
                 "--seed", "3", "--split-bytes", "20000", "--output", str(out), "--runner",
                 runner, *extra])


def _row_lines(err: str) -> dict[str | None, list[int]]:
    """Row counts printed per process (None: the launching process)."""
    shown: dict[str | None, list[int]] = {}
    for line in err.splitlines():
        m = LINE.search(line.strip())
        if m:
            shown.setdefault(m.group(1), []).append(int(m.group(2)))
    return shown


def _check_terminal(err: str, used: int) -> None:
    shown = _row_lines(err)
    assert shown, err
    for worker, counts in shown.items():
        assert counts == sorted(counts), (worker, counts)  # only goes up
        assert counts[-1] <= used
        assert len(counts) <= 6, (worker, counts)  # milestones, not one line per batch
    assert sum(c[-1] for c in shown.values()) <= used
    # an SDK worker logs one INFO line before it reads the options (its log level): allowed once
    # per worker; before the presets' WARNING default, direct-multi printed 36 INFO lines here
    chatter = [x for x in err.splitlines() if re.search(r"\bINFO\b", x)
               and "Logging handler created" not in x]
    assert not chatter, chatter[:5]
    assert err.count("Logging handler created") <= max(1, len(shown)), err
    assert "used 3000 →" in err  # the exact total, once, from the manifest


@pytest.mark.parametrize("runner", ["direct", "direct-multi"])
def test_progress_lines_go_up_and_workers_stay_quiet(adult_sample, tmp_path, capfd, runner):
    assert _synthesize(adult_sample, tmp_path / "out.csv", runner) == 0
    err = capfd.readouterr().err
    _check_terminal(err, 3000)
    if runner == "direct-multi":
        assert all(w is not None for w in _row_lines(err)), err  # workers name themselves
    assert _synthesize(adult_sample, tmp_path / "quiet.csv", runner, "--quiet") == 0
    _check_quiet(capfd.readouterr().err, runner)


def _check_quiet(err: str, runner: str) -> None:
    if runner == "direct":
        assert err == ""
        return
    # left: what each worker process logs to its own stderr while it starts, before it reads the
    # pipeline options (Beam's import warning, 'Logging handler created', ...): not beamsynth's
    assert "rows used" not in err and "synthesize" not in err and "spent" not in err, err
    assert [x for x in err.splitlines() if re.search(r"\bINFO\b", x)
            and "Logging handler created" not in x] == []


@pytest.mark.slow
def test_progress_on_dask(adult_sample, tmp_path, capfd):
    pytest.importorskip("dask.distributed")
    assert _synthesize(adult_sample, tmp_path / "out.csv", "dask") == 0
    _check_terminal(capfd.readouterr().err, 3000)
    assert _synthesize(adult_sample, tmp_path / "quiet.csv", "dask", "--quiet") == 0
    _check_quiet(capfd.readouterr().err, "dask")
