"""A quiet end for the DaskRunner's own ``LocalCluster``: workers' heartbeats stop before it closes.

A non-quiet run on ``--runner dask`` (no ``--dask_client_address``: the runner starts a
``LocalCluster`` and closes it when the run ends) could end with a worker's ``ERROR
distributed.worker: Failed to communicate with scheduler during heartbeat.`` and a
``CommClosedError`` traceback on the terminal, exit code 0 and every output correct.
``Worker.close`` stops its heartbeat callback but not a heartbeat already waiting for the
scheduler's answer, then closes its connections under it (the worker logs the ``OSError`` with
its traceback); under load, with the scheduler in the launcher's busy process, one is often in
flight (dask/distributed#7192 reports the same race at ``Client.shutdown``).

:class:`Heartbeats` (registered by the runner on its own cluster only) serialises each worker's
heartbeats through a lock; :func:`stop_heartbeats`, run on every worker once the run's result is
in, stops the heartbeat callback and waits for the one in flight (at most :data:`WAIT_SECONDS`),
which gets its answer from a scheduler that is still up. The cluster then closes with no heartbeat in flight. Nothing is
filtered: every log line of the workers and a task's exception reach the user as before.

Then :func:`close_workers` closes the workers before the cluster does, each given
:data:`CLOSE_SECONDS` to exit. The cluster's own close asks each worker process to stop and
kills it 4 s later (``Nanny.close``'s default timeout of 5 s, 80 % of it waited), logging
``WARNING distributed.nanny: Worker process still alive after 4.0 seconds, killing``; a worker
process with Beam, numpy and pyarrow loaded took longer than that to exit on the shared machine
at load 9–19 (H87 saw the line twice in one run, H96 in most runs), every output exact. With the
longer wait the processes end on their own, and the cluster then closes workers already closed.

Imported only by :mod:`beamsynth.runners.dask_runner` when it runs (``distributed`` is optional).
"""

from __future__ import annotations

import asyncio
from typing import Any

from distributed.diagnostics.plugin import WorkerPlugin

__all__ = ["CLOSE_SECONDS", "WAIT_SECONDS", "Heartbeats", "close_workers", "stop_heartbeats"]

_LOCK = "_beamsynth_heartbeats"  # the worker attribute holding the heartbeat lock
# How long a worker waits for its heartbeat in flight (normally milliseconds): a scheduler that
# does not answer by then is a real problem, and the close goes on (and may show it) as before.
WAIT_SECONDS = 10.0
# How long each worker process may take to exit once asked, before it is killed: far above the
# seconds a loaded machine needs; only a worker that hangs waits that long.
CLOSE_SECONDS = 60.0


class Heartbeats(WorkerPlugin):
    """Worker plugin: the worker's heartbeats run one at a time under a lock that
    :func:`stop_heartbeats` can wait on."""

    name = "beamsynth-heartbeats"

    def setup(self, worker: Any) -> None:
        """Wrap the worker's heartbeat callback (a ``tornado`` ``PeriodicCallback``) in the lock."""
        callback = worker.periodic_callbacks.get("heartbeat")
        if callback is None or getattr(worker, _LOCK, None) is not None:
            return
        lock = asyncio.Lock()
        beat = callback.callback

        async def heartbeat() -> None:
            async with lock:
                await beat()

        callback.callback = heartbeat
        setattr(worker, _LOCK, lock)


async def stop_heartbeats(dask_worker: Any) -> None:
    """On a worker (``client.run``), when the run is over: no new heartbeat starts, and the one
    in flight, if any, finishes while the scheduler still answers."""
    callback = dask_worker.periodic_callbacks.get("heartbeat")
    if callback is not None:
        callback.stop()
    lock = getattr(dask_worker, _LOCK, None)
    if lock is None:
        return
    try:
        await asyncio.wait_for(lock.acquire(), WAIT_SECONDS)
    except asyncio.TimeoutError:
        return
    lock.release()


async def close_workers(cluster: Any, timeout: float = CLOSE_SECONDS) -> None:
    """Close the runner's own cluster's workers (nannies), each process given ``timeout``
    seconds to exit, before the cluster closes (whose close would kill them after 4 s)."""
    workers = list(getattr(cluster, "workers", {}).values())
    await asyncio.gather(*(w.close(timeout=timeout, reason="beamsynth: the run is over")
                           for w in workers), return_exceptions=True)
