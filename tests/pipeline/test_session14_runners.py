"""Fourteenth session (H63): the DaskRunner's own LocalCluster ends without a heartbeat traceback.

A non-quiet ``--runner dask`` run (no ``--dask_client_address``: the runner starts and closes a
``LocalCluster``) could end with ``ERROR distributed.worker: Failed to communicate with scheduler
during heartbeat.`` and a ``CommClosedError`` traceback, exit code 0: a worker's heartbeat was
waiting for the scheduler when the worker closed its connections (runners/dask_shutdown.py).

The race is made deterministic here: the scheduler answers every heartbeat after
``_DELAY`` seconds and asks for the next one 10 ms later, so a heartbeat is nearly always in
flight when the run ends. The old shutdown (``_owns_cluster`` patched to False: plain
``client.close()``) shows the traceback in every run (checked in the same test, so the setup
cannot silently stop provoking it); the runner's shutdown shows none. Threads, not processes
(``processes=False``), keep each run near a second; the CLI with worker processes is the slow test.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib.util
import logging
import socket
import subprocess
import sys
import time
import warnings
from pathlib import Path

import apache_beam as beam
import pytest

import beamsynth as bs

distributed = pytest.importorskip("distributed")

from beamsynth.runners import dask_runner  # noqa: E402
from beamsynth.runners.dask_shutdown import Heartbeats  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
_DELAY = 0.5  # seconds the scheduler takes to answer a heartbeat
_RUN = 1.5  # seconds of tasks per run (8 elements of _RUN / 4 s on 2 worker threads)
_NOISE = ("Traceback", "Failed to communicate with scheduler during heartbeat",
          "Scheduler was unaware of this worker", "CommClosedError", "is already in use")


def _slow_heartbeats(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every scheduler made from now on answers heartbeats after ``_DELAY`` s and asks for the
    next one 10 ms later."""
    init = distributed.Scheduler.__init__

    def patched(self, *args, **kwargs):
        init(self, *args, **kwargs)
        beat = self.handlers["heartbeat_worker"]

        async def slow(*a, **k):
            await asyncio.sleep(_DELAY)
            return dict(beat(*a, **k), **{"heartbeat-interval": 0.01})

        self.handlers["heartbeat_worker"] = slow

    monkeypatch.setattr(distributed.Scheduler, "__init__", patched)


def _threads(monkeypatch: pytest.MonkeyPatch) -> None:
    """The runner's own ``LocalCluster`` with 2 workers as threads of this process."""
    monkeypatch.setattr(distributed, "Client", functools.partial(
        distributed.Client, processes=False, n_workers=2, threads_per_worker=1))


def _pause(x: int) -> int:
    time.sleep(_RUN / 4)
    return x


def _run(fn=_pause) -> None:
    """A run of about ``_RUN`` seconds (a worker's first heartbeat comes ~1 s after it starts)."""
    with beam.Pipeline(options=bs.pipeline_options(["--runner", "dask"])) as p:
        _ = p | beam.Create(list(range(8))) | beam.Map(fn)


class _Records(logging.Handler):
    """Every record of ``distributed``'s loggers (they do not propagate to the root logger)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{record.levelname} {record.name}: {record.getMessage()}"
                          + ("\nTraceback (exc_info)" if record.exc_info else ""))


@pytest.fixture
def shown(capfd):
    """What a user would see, read and cleared by calling it: ``distributed``'s log records
    (a traceback as ``Traceback``) and this process's stderr."""
    handler = _Records()
    logger = logging.getLogger("distributed")
    logger.addHandler(handler)

    def read() -> str:
        text = "\n".join(handler.lines) + "\n" + capfd.readouterr().err
        handler.lines.clear()
        return text

    yield read
    logger.removeHandler(handler)


def test_dask_runner_shuts_its_cluster_down_without_a_heartbeat_traceback(monkeypatch, shown):
    _slow_heartbeats(monkeypatch)
    _threads(monkeypatch)
    with monkeypatch.context() as old:  # the old shutdown: plain client.close()
        old.setattr(dask_runner, "_owns_cluster", lambda client: False)
        _run()
    before = shown()
    assert "Failed to communicate with scheduler during heartbeat" in before, before
    start = time.monotonic()
    with _port_8787_taken(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _run()
    after = shown() + "\n".join(str(w.message) for w in caught)
    assert not [n for n in _NOISE if n in after], after
    assert time.monotonic() - start < 30


@contextlib.contextmanager
def _port_8787_taken():
    """Port 8787 (``distributed``'s default dashboard port) is held, by us if nobody else."""
    sock = socket.socket()
    try:
        sock.bind(("", 8787))
        sock.listen()
    except OSError:
        pass  # another cluster holds it already
    try:
        yield
    finally:
        sock.close()


@pytest.mark.skipif(importlib.util.find_spec("bokeh") is not None, reason="bokeh: a dashboard")
def test_own_cluster_serves_http_on_a_free_port_without_bokeh():
    options: dict = {}
    dask_runner._quiet_dashboard(options)
    assert options == {"dashboard_address": ":0"}
    for given in ({"address": "tcp://h:8786"}, {"scheduler_file": "s.json"},
                  {"dashboard_address": ":8790"}):
        options = dict(given)
        dask_runner._quiet_dashboard(options)
        assert options == given


def test_a_task_error_still_fails_the_run_with_its_message(monkeypatch, shown):
    _slow_heartbeats(monkeypatch)
    _threads(monkeypatch)

    def fail_on_five(x: int) -> int:
        if x == 5:
            raise ValueError("h63: element 5 is bad")
        return _pause(x)

    with pytest.raises(ValueError, match="h63: element 5 is bad"):
        _run(fail_on_five)
    text = shown()
    assert "Failed to communicate with scheduler during heartbeat" not in text, text


def test_a_users_cluster_keeps_its_heartbeats(monkeypatch):
    """With ``--dask_client_address`` the cluster is the user's: no plugin, heartbeats go on."""
    with distributed.LocalCluster(processes=False, n_workers=1, threads_per_worker=1,
                                  dashboard_address=None) as cluster:
        with beam.Pipeline(options=bs.pipeline_options(
                ["--runner", "dask", f"--dask_client_address={cluster.scheduler_address}"])) as p:
            _ = p | beam.Create([1, -2, 3]) | beam.Map(abs)
        (worker,) = cluster.workers.values()
        assert Heartbeats.name not in worker.plugins
        assert worker.periodic_callbacks["heartbeat"].is_running()


_CLI = """
import asyncio, sys
import distributed
init = distributed.Scheduler.__init__
def patched(self, *args, **kwargs):
    init(self, *args, **kwargs)
    beat = self.handlers["heartbeat_worker"]
    async def slow(*a, **k):
        await asyncio.sleep({delay})
        return dict(beat(*a, **k), **{{"heartbeat-interval": 0.01}})
    self.handlers["heartbeat_worker"] = slow
distributed.Scheduler.__init__ = patched
if __name__ == "__main__":
    from beamsynth.pipelines.cli.main import main
    sys.argv = ["beamsynth", *sys.argv[1:]]
    raise SystemExit(main())
"""


@pytest.mark.slow
def test_cli_histogram_on_dask_with_progress_prints_no_traceback(tmp_path):
    """The user's path: the CLI with progress on, ``--runner dask``, worker processes (the
    scheduler in the CLI's process answers heartbeats after ``_DELAY`` s). Measured: 30-60 s at
    load 8-10 on the shared 2-core machine."""
    script = tmp_path / "cli.py"
    script.write_text(_CLI.format(delay=_DELAY))
    out = tmp_path / "sex.csv"
    done = subprocess.run(
        [sys.executable, str(script), "histogram", str(ROOT / "examples/data/adult/adult.csv"),
         "--column", "sex", "--domain", "list:Female,Male", "--epsilon", "1",
         "--tolerance", "0.5", "--output", str(out), "--runner", "dask"],
        capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert done.returncode == 0, done.stderr
    assert not [n for n in _NOISE if n in done.stderr], done.stderr
    assert "rows read 48842" in done.stderr and out.exists()
