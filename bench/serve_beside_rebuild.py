"""`mule serve` while a rebuild trains beside it: the latency of sentence searches alone,
then while `mule run train --force train` runs on the same machine (as a scheduled
rebuild runs beside the server in production), at the server's priority and with
MULE_NICE=10 (what the scheduled deployments set: flows/environment.py, yield_to_serving).

    python bench/serve_beside_rebuild.py --workdir mule-work [--seconds 20] [--rate 20] [--nice 10]

The workdir (a finished `mule demo`'s) is copied first: the rebuild retrains the copy's
model, which the server (--reload 0: it keeps what it loaded) never swaps in. One client
sends sentence queries (k=10, language detected) one after the other over loopback HTTP;
the figures are what that client waits. --rate paces it (queries a second; 0: back to
back, a core's worth of load on its own). The rebuild's own seconds are printed too, and
the same training alone, so that both sides of the sharing show. Run it on an otherwise
idle machine.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def sentences(workdir: Path, n: int = 300) -> list[str]:
    from mule.data_catalog.tables import Catalog
    from mule.storage.workdir import Workdir

    rows = Catalog(Workdir.at(workdir)).query(
        "SELECT text FROM captions WHERE dataset = 'embedded' ORDER BY caption_id").column("text").to_pylist()  # fmt: skip
    return random.Random(0).sample(rows, min(n, len(rows)))


def ask(port: int, queries: list[str], until: threading.Event | float, rate: float) -> list[float]:
    """Seconds each query waited, one after the other (`rate` a second at most; 0: back to
    back), until the deadline or the event."""
    waited = []
    n = 0
    while not (until.is_set() if isinstance(until, threading.Event) else time.monotonic() > until):
        q = urllib.parse.quote(queries[n % len(queries)])
        started = time.perf_counter()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/search?q={q}&k=10", timeout=60) as answer:
            answer.read()
        waited.append(time.perf_counter() - started)
        n += 1
        if rate > 0:
            time.sleep(max(0.0, 1 / rate - waited[-1]))
    return waited


def rebuild(workdir: Path, nice: str = "") -> float:
    """`mule run train --force train` on the workdir, with MULE_NICE=nice ("": unset); its seconds."""
    env = {k: v for k, v in os.environ.items() if k != "MULE_NICE"} | ({"MULE_NICE": nice} if nice else {})
    started = time.monotonic()
    subprocess.run([sys.executable, "-m", "mule.commands", "run", "train", "--force", "train", "--workdir",
                    str(workdir)], cwd=REPO, check=True, env=env, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)  # fmt: skip
    return time.monotonic() - started


def row(label: str, waited: list[float]) -> str:
    ms = sorted(w * 1000 for w in waited)
    p95 = ms[min(len(ms) - 1, int(0.95 * len(ms)))]
    return f"| {label} | {len(ms)} | {statistics.median(ms):.1f} | {p95:.1f} | {ms[-1]:.1f} |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, required=True, help="a finished `mule demo`'s workdir")
    parser.add_argument("--seconds", type=float, default=20.0, help="seconds of queries alone")
    parser.add_argument("--rate", type=float, default=20.0, help="queries a second (0: back to back)")
    parser.add_argument("--nice", default="10", help="MULE_NICE of the second rebuild beside the server")
    args = parser.parse_args()
    copy = Path(tempfile.mkdtemp(prefix="mule-serve-beside-")) / "work"
    shutil.copytree(args.workdir, copy, symlinks=True)
    queries = sentences(copy)
    alone_s = rebuild(copy)  # the training alone (and the copy's paths adopted before the server reads it)
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "mule.commands", "serve", "--workdir", str(copy), "--port",
                               str(port), "--reload", "0"], cwd=REPO, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/api/info", timeout=2)
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit("mule serve did not start") from None
                time.sleep(0.3)
        ask(port, queries, time.monotonic() + 3, args.rate)  # warm
        idle = ask(port, queries, time.monotonic() + args.seconds, args.rate)
        beside: dict[str, tuple[list[float], float]] = {}
        for nice in ("", args.nice):
            done = threading.Event()
            waited: list[float] = []
            client = threading.Thread(target=lambda: waited.extend(ask(port, queries, done, args.rate)))  # noqa: B023
            client.start()
            try:
                took = rebuild(copy, nice)
            finally:
                done.set()
                client.join()
            beside[nice] = (waited, took)
    finally:
        server.terminate()
        server.wait(timeout=30)
    print(f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}; "
          f"one client, {args.rate:g} queries/s (0: back to back); the rebuild alone {alone_s:.1f} s")  # fmt: skip
    print("| sentence searches | queries | p50 ms | p95 ms | max ms | median / alone | rebuild s |")
    print("|---|---|---|---|---|---|---|")
    print(row("mule serve alone", idle) + " 1.00 | – |")
    for nice, (waited, took) in beside.items():
        label = f"beside `mule run train --force train`, {f'MULE_NICE={nice}' if nice else 'the same priority'}"
        print(row(label, waited) + f" {statistics.median(waited) / statistics.median(idle):.2f} | {took:.1f} |")


if __name__ == "__main__":
    main()
