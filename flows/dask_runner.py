"""The features stage's shards over Dask workers (features.runner=dask)."""

from __future__ import annotations

import os

from mule.flows.prefect_server import prefect_server_for_workers


def dask_task_runner(features, shards: int):
    """prefect-dask's runner for the features shards: on the scheduler at
    features.dask_address, else on a LocalCluster with one process per GPU (each shard
    picks its GPU from the worker's number), or two on the CPU, splitting the cores."""
    from prefect_dask import DaskTaskRunner

    if features.dask_address:
        return DaskTaskRunner(address=features.dask_address)
    import torch

    cores = os.cpu_count() or 1
    gpus = torch.cuda.device_count() if features.device in ("auto", "cuda") else 0
    workers = features.dask_workers or gpus or min(2, cores)
    workers = max(1, min(workers, shards))
    threads = str(max(1, cores // workers))
    env = {"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}  # no oversubscription of the cores
    env |= prefect_server_for_workers()
    return DaskTaskRunner(cluster_class="distributed.LocalCluster",
                          cluster_kwargs={"n_workers": workers, "threads_per_worker": 1, "processes": True,
                                          "env": env, "dashboard_address": None})  # fmt: skip
