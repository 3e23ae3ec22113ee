"""Which device to compute on, and with how many CPU threads."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def resolve_device(name: str) -> torch.device:
    """"auto": CUDA when there is a GPU, else the CPU; any other name as torch reads it."""
    import torch

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def cpu_threads(requested: int) -> int:
    """The CPU threads torch computes with: `requested` (train.threads), or with 0 what
    torch would take by itself: OMP_NUM_THREADS where it is set, else one per core this
    process may run on. Training's results depend on the count (a parallel sum is split
    differently), so the count is part of the training stages' keys. Known without
    importing torch: keys are taken before anything heavy is imported."""
    if requested > 0:
        return requested
    try:
        return max(1, int(os.environ.get("OMP_NUM_THREADS", "")))
    except ValueError:
        pass
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def use_cpu_threads(requested: int) -> int:
    """Sets torch's CPU threads to cpu_threads(requested); returns the count."""
    import torch

    count = cpu_threads(requested)
    if torch.get_num_threads() != count:
        torch.set_num_threads(count)
    return count


def idle_threads_sleep() -> None:
    """OpenMP's idle threads sleep at a barrier instead of spinning (libgomp reads
    OMP_WAIT_POLICY when torch loads, so this must run first). Spinning threads wait for
    one the OS has descheduled: beside one busy process on 2 cores, demo training ran 3x
    and evaluation 13x slower (bench/contention.py). The results are the same either way.
    Only where the user has not chosen, and only before torch is imported."""
    if "torch" not in sys.modules:
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
