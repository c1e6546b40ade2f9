"""``python -m beamsynth.runners.sdk_worker``: Beam's SDK worker for ``--runner direct-multi``,
without its three startup lines on the terminal.

The ``direct-multi`` preset's worker processes are Beam's ``sdk_worker_main``; each printed, on
every run: Beam's import-time ``WARNING:root:apitools not found, and bigquery client libraries are
not available ...`` (its ``logging.warning`` also gave the worker a stderr handler, which is why
anything else printed at all), ``INFO:__main__:Logging handler created.`` (logged at INFO before
the worker reads its options) and ``WARNING:__main__:No semi_persistent_directory found: User
registered objects ... may not be effective`` (the DirectRunner never stages a main session).

This module puts a filter dropping exactly those three messages (below ERROR) on the two loggers
that log them (the root logger's own records, ``sdk_worker_main``'s), gives the worker the same
stderr handler as before, then runs ``sdk_worker_main``. The three no longer reach the terminal
nor the launcher (which relayed the third again as ``WARNING:apache_beam.runners.portability.
local_job_service:Worker: severity: WARN ...``, one line per worker, in a job of your own; the
CLI hides Beam's relayed lines below ERROR). Everything else a worker logs prints and is
relayed as before (a DoFn's warnings, errors, a failing bundle's traceback).
:class:`beamsynth.runners.local.LocalDirectRunner` starts its worker processes with this module.
"""

from __future__ import annotations

import logging
import sys

__all__ = ["STARTUP_NOISE", "main", "startup_noise"]

# (logger name, start of the message) of each line dropped from the worker's stderr. The third
# only in its cloudpickle wording (dill's says functions of __main__ may fail: kept).
STARTUP_NOISE = (
    ("root", "apitools not found, and bigquery client libraries are not available"),
    ("apache_beam.runners.worker.sdk_worker_main", "Logging handler created."),
    ("apache_beam.runners.worker.sdk_worker_main",
     "No semi_persistent_directory found:  User registered objects"),
)


def startup_noise(record: logging.LogRecord) -> bool:
    """Whether ``record`` is one of :data:`STARTUP_NOISE` (never an ERROR or worse)."""
    if record.levelno >= logging.ERROR:
        return False
    message = record.getMessage()
    return any(record.name == name and message.startswith(start) for name, start in STARTUP_NOISE)


def main(argv: list[str] | None = None) -> None:
    """Filter the three loggers, give the worker its stderr handler (Python's basic one, as
    before), then run Beam's ``sdk_worker_main``."""
    if not logging.getLogger().handlers:  # importing this package may have made it already
        logging.basicConfig()
    for name in {name for name, _ in STARTUP_NOISE}:  # the loggers themselves: stderr and relay
        logging.getLogger(None if name == "root" else name).addFilter(
            lambda record: not startup_noise(record))
    from apache_beam.runners.worker import sdk_worker_main

    sdk_worker_main.main(sys.argv if argv is None else argv)


if __name__ == "__main__":
    main()
