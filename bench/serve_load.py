"""`mule serve` under load, on loopback: N concurrent clients (keep-alive, each asking as
fast as it is answered) for a fixed time, while one more client keeps uploading a
9000 x 9000 PNG (258 KB, 81 MP); throughput, p50/p99 latency, errors and the server's
resident memory before and after.

    python bench/serve_load.py [--workdir DIR] [--clients 1,8,32] [--seconds 20] [--image-share 0.2]
                               [--python PY --module M] [--serve-arg=--max-megapixels=100 ...]

--workdir: a workdir with a champion (default: a small demo workdir built first, ~1 min).
Requests: sentences drawn from the catalog's captions by a seed (GET /api/search, k=10)
and, --image-share of them, catalog images posted as uploads (POST /api/image, k=5).
An error is any answer but 200 to those (a 503 too), or no answer; the big PNG's 413
is counted apart. --python/--module run another mule's server (a checkout from before,
for comparison); --serve-arg passes options to it.
"""

from __future__ import annotations

import argparse
import http.client
import io
import json
import random
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
SMALL = ["--train-images", "400", "--val-images", "100", "--test-images", "200", "--set", "train.epochs=2",
         "--set", "pretrain.epochs=1", "--set", "text.fasttext_epochs=2"]  # fmt: skip


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def big_png() -> bytes:
    """A real 9000 x 9000 PNG (one colour, so it compresses to ~258 KB)."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("L", (9000, 9000), 200).save(buffer, "PNG", optimize=True)
    return buffer.getvalue()


def rss_mb(pid: int) -> float:
    import psutil

    return psutil.Process(pid).memory_info().rss / 2**20


class Client(threading.Thread):
    def __init__(self, port: int, until: float, sentences: list[str], images: list[bytes], share: float, seed: int):
        super().__init__(daemon=True)
        self.port, self.until, self.sentences, self.images, self.share = port, until, sentences, images, share
        self.random = random.Random(seed)
        self.latencies: dict[str, list[float]] = {"search": [], "image": []}
        self.errors: list[str] = []

    def run(self) -> None:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        while time.perf_counter() < self.until:
            kind = "image" if self.random.random() < self.share else "search"
            started = time.perf_counter()
            try:
                if kind == "search":
                    query = urllib.parse.urlencode({"q": self.random.choice(self.sentences), "k": 10})
                    connection.request("GET", f"/api/search?{query}")
                else:
                    connection.request("POST", "/api/image?k=5", body=self.random.choice(self.images),
                                       headers={"Content-Type": "application/octet-stream"})  # fmt: skip
                response = connection.getresponse()
                body = response.read()
                if response.status != 200:
                    self.errors.append(f"{kind} {response.status} {body[:120]!r}")
            except (OSError, http.client.HTTPException) as error:
                self.errors.append(f"{kind} {error!r}")
                connection.close()
                connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
            self.latencies[kind].append(time.perf_counter() - started)
        connection.close()


class BigUploads(threading.Thread):
    """Keeps the 81 MP PNG in flight: posts it again as soon as it is answered."""

    def __init__(self, port: int, until: float, png: bytes):
        super().__init__(daemon=True)
        self.port, self.until, self.png = port, until, png
        self.answers: dict[int, int] = {}
        self.seconds: list[float] = []

    def run(self) -> None:
        while time.perf_counter() < self.until:
            connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
            started = time.perf_counter()
            try:
                connection.request("POST", "/api/image?k=5", body=self.png)
                response = connection.getresponse()
                response.read()
                self.answers[response.status] = self.answers.get(response.status, 0) + 1
            except (OSError, http.client.HTTPException):
                self.answers[-1] = self.answers.get(-1, 0) + 1
            finally:
                connection.close()
            self.seconds.append(time.perf_counter() - started)


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def catalog_samples(workdir: Path, seed: int) -> tuple[list[str], list[bytes]]:
    from mule.data_catalog.catalog import Catalog
    from mule.data_catalog.queries import image_paths
    from mule.data_catalog.workdir import Workdir

    catalog = Catalog(Workdir.at(workdir))
    rows = catalog.query("SELECT text FROM captions WHERE dataset = 'embedded' ORDER BY caption_id").column("text").to_pylist()
    rng = random.Random(seed)
    paths = sorted(image_paths(catalog, "embedded").values())
    return rng.sample(rows, min(500, len(rows))), [Path(p).read_bytes() for p in rng.sample(paths, min(50, len(paths)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", type=Path)
    parser.add_argument("--clients", default="1,8,32")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--image-share", type=float, default=0.2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--module", default="mule.flows.cli")
    parser.add_argument("--cwd", type=Path, default=REPO)
    parser.add_argument("--serve-arg", action="append", default=[])
    args = parser.parse_args()
    workdir = args.workdir
    if workdir is None:
        workdir = Path(tempfile.mkdtemp(prefix="mule-serve-load-")) / "workdir"
        print(f"building a small demo workdir in {workdir} ...", flush=True)
        subprocess.run([str(Path(sys.executable).with_name("mule")), "demo", "--workdir", str(workdir), *SMALL],
                       check=True, capture_output=True)  # fmt: skip
    sentences, images = catalog_samples(workdir, args.seed)
    png = big_png()
    port = free_port()
    command = [args.python, "-m", args.module, "serve", "--workdir", str(workdir), "--port", str(port), *args.serve_arg]
    server = subprocess.Popen(command, cwd=args.cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 180
        while True:
            try:
                info = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/api/info", timeout=2).read())
                break
            except OSError:
                if server.poll() is not None or time.time() > deadline:
                    sys.exit(f"the server did not start: {server.stdout.read()[-3000:]}")
                time.sleep(0.5)
        warm = Client(port, time.perf_counter() + 3, sentences, images, args.image_share, 999)
        warm.run()
        start_rss = rss_mb(server.pid)
        print(f"$ {' '.join(command)}")
        print(f"gallery {info['images']:,} images, model {info['model']}; big upload: {len(png) / 1024:.0f} KB PNG, "
              f"9000 x 9000; server RSS after warm-up {start_rss:.0f} MB; {args.seconds:.0f} s per row", flush=True)  # fmt: skip
        lines = ["| clients | requests/s | search p50 / p99 ms | upload p50 / p99 ms | errors | 81 MP PNG answers "
                 "(s each) | server RSS MB |", "|---|---|---|---|---|---|---|"]  # fmt: skip
        for count in [int(c) for c in args.clients.split(",")]:
            until = time.perf_counter() + args.seconds
            clients = [Client(port, until, sentences, images, args.image_share, args.seed + i) for i in range(count)]
            bomb = BigUploads(port, until, png)
            for thread in [bomb, *clients]:
                thread.start()
            for thread in [bomb, *clients]:
                thread.join(args.seconds + 130)
            search = [x for c in clients for x in c.latencies["search"]]
            upload = [x for c in clients for x in c.latencies["image"]]
            errors = [e for c in clients for e in c.errors]
            answers = ", ".join(f"{n} x {code}" for code, n in sorted(bomb.answers.items()))
            lines.append(f"| {count} | {(len(search) + len(upload)) / args.seconds:.1f} | "
                         f"{1000 * percentile(search, 0.5):.1f} / {1000 * percentile(search, 0.99):.1f} | "
                         f"{1000 * percentile(upload, 0.5):.1f} / {1000 * percentile(upload, 0.99):.1f} | "
                         f"{len(errors)} | {answers} ({statistics.median(bomb.seconds):.2f}) | {rss_mb(server.pid):.0f} |")  # fmt: skip
            print(lines[-1], flush=True)
            for error in errors[:3]:
                print(f"    e.g. {error}")
        end_rss = rss_mb(server.pid)
        print("\n" + "\n".join(lines))
        print(f"\nserver RSS: {start_rss:.0f} MB after warm-up, {end_rss:.0f} MB at the end ({end_rss - start_rss:+.0f} MB)")
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()


if __name__ == "__main__":
    main()
