"""Fixtures shared by the test layers (pipeline and audit)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def dask_address():
    """A local dask.distributed cluster with 2 single-threaded worker processes (one per module)."""
    distributed = pytest.importorskip("distributed", reason="pip install 'beamsynth[dask]'")
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                       dashboard_address=None)
    try:
        yield cluster.scheduler_address
    finally:
        # The DaskRunner opens a Client per run and never closes it; close them before the cluster.
        for client in list(distributed.client._global_clients.values()):
            client.close()
        cluster.close()


@pytest.fixture(autouse=True, scope="session")
def _quiet_unrecorded_jobs():
    """Most tests build jobs without bs.WriteManifest on purpose; the warning for that
    (transforms.private.WARN_UNRECORDED) is checked in a fresh interpreter by
    tests/pipeline/test_unrecorded_job.py."""
    from beamsynth.transforms import private

    private.WARN_UNRECORDED = False
    yield
