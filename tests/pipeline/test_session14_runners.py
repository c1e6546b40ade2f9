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
import os
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


# --- direct-multi: the workers' startup lines (runners/sdk_worker.py) ---------------------------

_STARTUP = ("apitools not found", "Logging handler created", "No semi_persistent_directory found")


def test_startup_noise_is_exactly_three_messages_below_error():
    from beamsynth.runners.sdk_worker import startup_noise

    def record(name: str, level: int, msg: str, *args) -> logging.LogRecord:
        return logging.LogRecord(name, level, __file__, 1, msg, args, None)

    main = "apache_beam.runners.worker.sdk_worker_main"
    assert startup_noise(record("root", logging.WARNING, "apitools not found, and bigquery client "
                                "libraries are not available despite the import not raising"))
    assert startup_noise(record(main, logging.INFO, "Logging handler created."))
    assert startup_noise(record(main, logging.WARNING, "No semi_persistent_directory found: %s",
                                " User registered objects (e.g. schema) may not be effective"))
    kept = [record(main, logging.WARNING, "No semi_persistent_directory found: %s",  # dill's
                   " Functions defined in __main__ (interactive session) may fail."),
            record(main, logging.ERROR, "Logging handler created."),
            record("__main__", logging.INFO, "Logging handler created."),  # a user's script
            record("root", logging.WARNING, "something else")]
    assert not [r for r in kept if startup_noise(r)]


class _WarnOnThree(beam.DoFn):
    def process(self, x: int):
        if x == 3:
            logging.getLogger("h63.user").warning("h63 user warning, x=%s", x)
        if x == 5 and os.environ.get("H63_FAIL"):
            raise ValueError("h63: element 5 is bad")
        yield x


def _direct_multi() -> None:
    with beam.Pipeline(options=bs.pipeline_options(["--runner", "direct-multi"])) as p:
        _ = p | beam.Create(list(range(8))) | beam.ParDo(_WarnOnThree())


def test_direct_multi_worker_command_is_rewritten_during_a_run_only():
    from apache_beam.transforms.environments import SubprocessSDKEnvironment

    from beamsynth.runners import local

    command = f"{sys.executable} {local.BEAM_WORKER}"
    with local._worker_command():
        inside = SubprocessSDKEnvironment.from_command_string(command).command_string
        other = SubprocessSDKEnvironment.from_command_string("my_worker --flag").command_string
    after = SubprocessSDKEnvironment.from_command_string(command).command_string
    assert inside == f"{sys.executable} -m beamsynth.runners.sdk_worker"
    assert other == "my_worker --flag" and after == command


@pytest.mark.slow
def test_direct_multi_workers_print_no_startup_lines_but_a_dofns_warning(capfd, monkeypatch):
    """Measured: 7.8 s at load ~10 (two worker processes start)."""
    monkeypatch.delenv("H63_FAIL", raising=False)
    _direct_multi()
    err = capfd.readouterr().err
    assert not [s for s in _STARTUP if s in err], err
    assert "h63 user warning, x=3" in err


@pytest.mark.slow
def test_direct_multi_worker_error_still_fails_the_run(capfd, monkeypatch):
    """Measured: 7.4 s at load ~10."""
    monkeypatch.setenv("H63_FAIL", "1")  # read in the worker processes
    with pytest.raises(Exception, match="h63: element 5 is bad"):
        _direct_multi()
    err = capfd.readouterr().err
    assert "h63: element 5 is bad" in err
