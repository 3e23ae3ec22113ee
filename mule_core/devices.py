"""Which device to compute on, and with how many CPU threads."""

from __future__ import annotations

import functools
import logging
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from concurrent.futures import ProcessPoolExecutor

    import torch


def resolve_device(name: str) -> torch.device:
    """"auto": CUDA when there is a GPU, else the CPU; any other name as torch reads it."""
    import torch

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def cuda_visible() -> bool:
    """Whether torch would find a CUDA device (resolve_device's "auto"): asked of torch when
    it is imported already; else known without importing it (keys are taken before
    anything heavy is imported): the installed torch has its CUDA library, and NVIDIA's
    management library counts a device that CUDA_VISIBLE_DEVICES does not hide. NVML makes
    no CUDA context, so a process that forks afterwards is not harmed."""
    torch = sys.modules.get("torch")
    if torch is not None:
        return torch.cuda.is_available()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1"):
        return False
    return _torch_has_cuda() and _nvml_devices() > 0


@functools.cache
def _torch_has_cuda() -> bool:
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("torch")
    places = list(spec.submodule_search_locations or []) if spec else []
    return any(any((Path(p) / "lib").glob("libtorch_cuda*")) for p in places)


@functools.cache
def _nvml_devices() -> int:
    import ctypes

    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:  # no NVIDIA driver
        return 0
    if nvml.nvmlInit_v2() != 0:
        return 0
    count = ctypes.c_uint(0)
    found = nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)) == 0
    nvml.nvmlShutdown()
    return count.value if found else 0


def device_kind(name: str) -> str:
    """train.device resolved as resolve_device resolves it, as a kind ("cpu", "cuda"), without torch."""
    if name == "auto":
        return "cuda" if cuda_visible() else "cpu"
    return name.split(":", 1)[0]


def training_arithmetic(device: str, amp: bool) -> str:
    """Where a training stage computes and in which arithmetic: part of its key, since a
    model trained in float16 autocast on a GPU is another model than one trained in
    float32 on the CPU ("cpu float32", "cuda float16-autocast", "cuda float32")."""
    kind = device_kind(device)
    return f"{kind} {'float16-autocast' if kind == 'cuda' and amp else 'float32'}"


def cpu_threads(requested: int) -> int:
    """The CPU threads torch computes with: `requested` (train.threads), or with 0 what
    torch would take by itself: OMP_NUM_THREADS where it is set, else one per core this
    process may run on. Known without importing torch. Not part of any key: 1 and 2 threads
    split a parallel sum differently, and train the same model to within the tolerance
    tests/test_training.py states; the count is recorded with each run."""
    if requested > 0:
        return requested
    try:
        return max(1, int(os.environ.get("OMP_NUM_THREADS", "")))
    except ValueError:
        return usable_cores()


def usable_cores() -> int:
    """The cores this process may run on (a stage has them all: stages run one at a time)."""
    return machine_cores()


def machine_cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def worker_processes(count: int) -> ProcessPoolExecutor:
    """A pool of `count` processes for work split in chunks (the generated dataset's
    images, the captions' tokens). Spawned, not forked: the caller may hold threads
    (Prefect's, MLflow's) and their locks. They ignore Ctrl-C, which the command handles:
    it stops them (shutdown with cancel_futures) after the chunk each is on."""
    import signal
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    return ProcessPoolExecutor(count, mp_context=get_context("spawn"), initializer=signal.signal,
                               initargs=(signal.SIGINT, signal.SIG_IGN))  # fmt: skip


@contextmanager
def process_map(count: int, chunksize: int = 1) -> Iterator[Callable[..., Iterator]]:
    """`map`, results in order, on `count` of worker_processes' processes; the builtin
    map when `count` is below 2. On a stop the chunks not started are dropped."""
    if count < 2:
        yield map
        return
    pool = worker_processes(count)
    try:
        yield functools.partial(pool.map, chunksize=chunksize)
    finally:
        pool.shutdown(cancel_futures=True)


def use_cpu_threads(requested: int) -> int:
    """Sets torch's CPU threads to cpu_threads(requested); returns the count."""
    import torch

    count = cpu_threads(requested)
    if torch.get_num_threads() != count:
        torch.set_num_threads(count)
    return count


@contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """torch on `count` CPU threads meanwhile. Where ONNX Runtime's threads do the work, 1:
    after each parallel op torch's idle OpenMP threads spin a while, on the cores ONNX
    Runtime needs (the demo's features stage ran at 82-87 images/s beside them, 119 without)."""
    import torch

    before = torch.get_num_threads()
    if count != before:
        torch.set_num_threads(count)
    try:
        yield
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)


def cores_busy(window_s: float = 0.1, stat: str = "/proc/stat") -> float | None:
    """How many cores the machine's processes keep busy now: the non-idle share of every
    CPU's time over `window_s` (this process sleeps meanwhile, so it is the others'), times
    the CPUs. None where /proc/stat cannot be read (not Linux)."""
    import time

    def sample() -> tuple[int, int, int]:
        with open(stat, encoding="ascii") as f:
            lines = f.read().splitlines()
        fields = [int(v) for v in lines[0].split()[1:9]]  # user nice system idle iowait irq softirq steal
        cpus = sum(1 for line in lines[1:] if line.startswith("cpu"))
        idle = fields[3] + fields[4]
        return sum(fields) - idle, sum(fields), max(1, cpus)

    try:
        busy0, total0, _ = sample()
        time.sleep(window_s)
        busy1, total1, cpus = sample()
    except (OSError, ValueError, IndexError):
        return None
    if total1 <= total0:
        return None
    return (busy1 - busy0) / (total1 - total0) * cpus


_SAMPLED = False


def idle_threads_sleep(always: bool = False) -> None:
    """OpenMP's idle threads sleep at a barrier at once instead of spinning a while
    (OMP_WAIT_POLICY=PASSIVE; libgomp reads it when torch loads, so this must run first).
    Spinning threads wait for one the OS has descheduled: beside one busy process on 2
    cores, demo training kept 38% of its speed alone with libgomp's spin and 63% with
    PASSIVE; alone, PASSIVE costs 14% on that bench and 45% on the demo's own training
    (its LSTM's many small steps), so it is only for a machine busy now. So: always for a
    server (`mule serve` shares the machine with rebuilds), else when other processes keep
    half a core or more busy over the 0.1 s before torch loads (cores_busy; where that
    cannot be read, the load average of the last minute, which also counts a run that has
    just ended). The results are the same either way. Never where the user has chosen, and
    never after torch is imported."""
    global _SAMPLED
    if "torch" in sys.modules or "OMP_WAIT_POLICY" in os.environ:
        return
    if not always:
        if _SAMPLED:  # decided once a process (the command's and the flows' calls): sampled once
            return
        _SAMPLED = True
        elsewhere = cores_busy()
        if elsewhere is None:
            try:
                elsewhere = os.getloadavg()[0]
            except OSError:  # no load average here
                elsewhere = 0.0
        if elsewhere < 0.5:
            return
        # the run's log says so: training on the CPU is up to 45% slower with it
        logging.getLogger("mule.devices").info("OMP_WAIT_POLICY=PASSIVE: other processes kept %.2f cores busy "
                                               "as this one started", elsewhere)  # fmt: skip
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
