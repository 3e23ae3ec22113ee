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
        return usable_cores()


def usable_cores() -> int:
    """The cores this process may run on."""
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


def idle_threads_sleep(always: bool = False) -> None:
    """OpenMP's idle threads sleep at a barrier at once instead of spinning a while
    (OMP_WAIT_POLICY=PASSIVE; libgomp reads it when torch loads, so this must run first).
    Spinning threads wait for one the OS has descheduled: beside one busy process on 2
    cores, demo training kept 38% of its speed alone with libgomp's spin and 63% with
    PASSIVE; alone, PASSIVE costs 14% (bench/contention.py). So: always for a server
    (`mule serve` shares the machine with rebuilds), else when the machine is already busy
    (load average of the last minute at least 0.5). The results are the same either way.
    Never where the user has chosen, and never after torch is imported."""
    if "torch" in sys.modules or "OMP_WAIT_POLICY" in os.environ:
        return
    try:
        busy = os.getloadavg()[0] >= 0.5
    except OSError:  # no load average here
        busy = False
    if always or busy:
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
