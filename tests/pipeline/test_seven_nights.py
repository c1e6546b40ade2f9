"""Seven nightly releases of a growing dataset against a lifetime budget that allows five.

Night three is SIGKILLed after its ledger reservation (its table step blocks forever, so the
process is provably stuck before anything is published); the ledger then lets night three be
rerun exactly once. Nights six and seven must be refused before reading data: their input is a
FIFO nobody writes, so a release that tried to open it would hang until the timeout.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from beamsynth.pipelines.cli.main import main
from beamsynth.pipelines.releases.config import load_release_config
from beamsynth.pipelines.releases.ledger import (
    LedgerBudgetExceededError,
    LedgerError,
    PrivacyLedger,
)
from beamsynth.pipelines.releases.release import run_release

ADULT = Path(__file__).resolve().parents[2] / "examples" / "data" / "adult" / "adult.csv"

CONFIG = """
name: nightly
folder: {root}/releases/night-{{date}}
budget: {{epsilon: 1.0}}
ledger:
  path: {root}/ledger.sqlite
  policies:
    adult: {{epsilon: 5.0}}
seed: 7
demo: true
tables:
  - name: adult
    source: adult
    input: {input}
    schema: adult
    method: independent
    epsilon: 1.0
    formats: [csv]
reports: {{private: false, public: false}}
"""


def _night_input(root: Path, night: int) -> Path:
    """The first 200·night rows of Adult: the dataset grows every night."""
    lines = ADULT.read_text(encoding="utf-8").splitlines(keepends=True)
    path = root / "data" / f"adult-{night}.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(lines[: 1 + 200 * night]), encoding="utf-8")
    return path


def _fifo(root: Path, night: int) -> Path:
    path = root / "data" / f"fifo-{night}.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(path)
    return path


def _feed_fifo(path: Path) -> None:
    """Give a reader of the FIFO an empty file (no-op when nobody is reading)."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:
        pass


def _config(root: Path, night: int, data: Path) -> Path:
    path = root / f"night-{night}.yaml"
    path.write_text(CONFIG.format(root=root, input=data), encoding="utf-8")
    return path


def _date(night: int) -> str:
    return f"2026-01-{night:02d}"


def _run(root: Path, night: int, data: Path) -> dict:
    cfg = load_release_config(_config(root, night, data), date=_date(night))
    return run_release(cfg)


def _cli(root: Path, night: int, data: Path) -> list[str]:
    return [sys.executable, "-m", "beamsynth.pipelines.cli.main", "--quiet", "release",
            str(_config(root, night, data)), "--date", _date(night)]


def _stuck_cli(root: Path, night: int, data: Path) -> list[str]:
    """The release CLI with its table step blocked: it reserves, then never publishes."""
    args = _cli(root, night, data)[3:]
    code = ("import sys, time; import beamsynth.pipelines.releases.release as r; "
            "r._run_table = lambda *a, **k: time.sleep(3600); "
            f"from beamsynth.pipelines.cli.main import main; sys.exit(main({args!r}))")
    return [sys.executable, "-c", code]


def _states(ledger: Path) -> list[tuple[str, str]]:
    with sqlite3.connect(ledger) as con:
        return con.execute("SELECT run_key, state FROM releases ORDER BY created").fetchall()


@pytest.mark.slow  # seven nightly releases end to end (~21 s)
@pytest.mark.skipif(not ADULT.exists(), reason="examples/data/adult/adult.csv is not in this checkout")
@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs POSIX FIFOs")
def test_seven_nights(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    ledger_path = tmp_path / "ledger.sqlite"
    folder = lambda n: tmp_path / "releases" / f"night-{_date(n)}"  # noqa: E731

    for night in (1, 2):
        release = _run(tmp_path, night, _night_input(tmp_path, night))
        assert release["spent"]["epsilon"] == pytest.approx(1.0)
        assert (folder(night) / "public" / "adult.csv").exists()

    # Night 3: a subprocess reserves, then blocks before publishing; kill it for real.
    proc = subprocess.Popen(_stuck_cli(tmp_path, 3, _night_input(tmp_path, 3)),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while time.time() < deadline:
        if any(state == "pending" for _, state in _states(ledger_path)):
            break
        assert proc.poll() is None, proc.stderr.read().decode()
        time.sleep(0.05)
    else:
        proc.kill()
        pytest.fail("night 3 never reserved its spend")
    time.sleep(0.5)  # let it get stuck
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    assert not folder(3).exists()
    assert [s for _, s in _states(ledger_path)] == ["committed", "committed", "pending"]
    shown = subprocess.run([sys.executable, "-m", "beamsynth.pipelines.cli.main", "ledger", "show",
                            str(ledger_path)], capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0 and "spent ε=3 of lifetime ε=5 (ε=2 left)" in shown.stdout
    assert "lifetime total ε=3 over 3 release(s)" in shown.stdout  # the pending night counts
    assert shown.stdout.count("pending") == 1

    # Rerun night 3: the dead reservation is released (nothing was published) and replaced.
    _run(tmp_path, 3, _night_input(tmp_path, 3))
    assert [s for _, s in _states(ledger_path)] == ["committed", "committed", "aborted", "committed"]
    assert not list((tmp_path / "releases").glob(".*tmp-*")), "the killed run's temp folder remains"
    # ... exactly once: a second rerun of night 3 is refused.
    with pytest.raises(LedgerError, match="already published"):
        _run(tmp_path, 3, _night_input(tmp_path, 3))

    for night in (4, 5):
        release = _run(tmp_path, night, _night_input(tmp_path, night))
    summary = PrivacyLedger(ledger_path).summary()
    assert summary[0]["epsilon_spent"] == pytest.approx(5.0)
    adult = release["ledger"]["sources"]["adult"]  # release.json of night 5
    assert adult["lifetime_total"] == {"epsilon": pytest.approx(5.0), "delta": 0.0, "releases": 5}
    assert adult["renews"] is False and adult["privacy_unit"]["unit"] == "record"
    assert release["ledger"]["night"] == "nightly@night-2026-01-05"  # no path of this machine

    # --check of a night already published: says so and exits 2 (it used to print "ok")
    assert main(["release", str(_config(tmp_path, 4, _night_input(tmp_path, 4))), "--date", _date(4),
                 "--check"]) == 2
    err = capsys.readouterr().err
    assert "--check: nightly" in err and "was already published" in err and "ok:" not in err

    # Night 6 in-process, night 7 through the CLI: refused before reading (FIFO inputs).
    fifo6 = _fifo(tmp_path, 6)
    unblock = threading.Timer(60, _feed_fifo, args=(fifo6,))  # a wrongly reading run ends, then fails
    unblock.start()
    try:
        with pytest.raises(LedgerBudgetExceededError, match="refused before reading any data"):
            _run(tmp_path, 6, fifo6)
    finally:
        unblock.cancel()
    done = subprocess.run(_cli(tmp_path, 7, _fifo(tmp_path, 7)), capture_output=True, timeout=120)
    assert done.returncode == 2
    assert b"refused before reading any data" in done.stderr
    assert not folder(6).exists() and not folder(7).exists()
    assert len(_states(ledger_path)) == 6  # refused nights leave no row
    assert PrivacyLedger(ledger_path).summary()[0]["epsilon_spent"] == pytest.approx(5.0)
    published = sorted(p.name for p in (tmp_path / "releases").iterdir())
    assert published == [f"night-{_date(n)}" for n in range(1, 6)]
