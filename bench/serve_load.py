"""`mule serve` under load, on loopback: N concurrent clients (keep-alive, each asking as
fast as it is answered) for a fixed time, while one more client keeps uploading a
9000 x 9000 PNG (258 KB, 81 MP); throughput, p50/p99 latency, errors and the server's
resident memory before and after.

    python bench/serve_load.py [--workdir DIR] [--clients 1,8,32] [--seconds 20] [--image-share 0.2]
                               [--hostile 80] [--python PY --module M] [--serve-arg=--max-megapixels=100 ...]

--hostile N: a second table, each row with N slow clients beside the N honest ones (half
announce a 1 MB upload and send a byte a second, half never finish their headers; each
reconnects when dropped) and four 6000 x 6000 16-bit PNG uploads at once (36 MP, a few
hundred KB each) kept in flight: the honest clients' throughput and latency, what the
slow ones got, and the server's peak resident memory.

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
         "--set", "pretrain.epochs=1", "--set", "vectors.fasttext_epochs=2"]  # fmt: skip


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


class SlowClients(threading.Thread):
    """`count` connections at a time that never finish: uploads announcing 1 MB and sending
    a byte a second, or headers that never end; a dropped one is replaced. Counts the
    statuses the server sent them (0: closed without an answer)."""

    def __init__(self, port: int, until: float, count: int):
        super().__init__(daemon=True)
        self.port, self.until, self.count = port, until, count
        self.statuses: dict[int, int] = {}

    def _open(self, n: int) -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=5)
        sock.setblocking(False)
        if n % 2:
            sock.sendall(f"POST /api/image HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\nContent-Length: {2**20}\r\n\r\n"
                         .encode())  # fmt: skip
        else:
            sock.sendall(f"GET /api/info HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\nX-Slow: ".encode())
        return sock

    def run(self) -> None:
        open_ = [self._open(n) for n in range(self.count)]
        while time.perf_counter() < self.until:
            for n, sock in enumerate(open_):
                try:
                    head = sock.recv(64)
                    code = int(head.split()[1]) if head.startswith(b"HTTP/") else 0
                    self.statuses[code] = self.statuses.get(code, 0) + 1
                    sock.close()
                    open_[n] = self._open(n)
                except BlockingIOError:
                    try:
                        sock.send(b"x")  # one more byte of a body (or of a header) that never ends
                    except OSError:
                        pass
                except OSError:
                    open_[n] = self._open(n)
            time.sleep(1.0)
        for sock in open_:
            sock.close()


class PeakRSS(threading.Thread):
    def __init__(self, pid: int, until: float):
        super().__init__(daemon=True)
        self.pid, self.until, self.peak = pid, until, 0.0

    def run(self) -> None:
        while time.perf_counter() < self.until:
            self.peak = max(self.peak, rss_mb(self.pid))
            time.sleep(0.05)


def png16(side: int) -> bytes:
    """A side x side 16-bit grey PNG (a gradient: a few hundred KB for tens of megapixels)."""
    import numpy as np
    from PIL import Image

    row = (np.arange(side, dtype=np.uint32) * 65535 // (side - 1)).astype(np.uint16)
    buffer = io.BytesIO()
    Image.fromarray(np.broadcast_to(row, (side, side)).copy()).save(buffer, "PNG")
    return buffer.getvalue()


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def catalog_samples(workdir: Path, seed: int) -> tuple[list[str], list[bytes]]:
    from mule.data_catalog.queries import image_paths
    from mule.data_catalog.tables import Catalog
    from mule.storage.workdir import Workdir

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
    parser.add_argument("--module", default="mule.commands")
    parser.add_argument("--cwd", type=Path, default=REPO)
    parser.add_argument("--serve-arg", action="append", default=[])
    parser.add_argument("--hostile", type=int, default=0, help="slow clients per row of the hostile table (0: none)")
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
        if args.hostile:
            hostile(args, port, server.pid, sentences, images)
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()


def hostile(args, port: int, pid: int, sentences: list[str], images: list[bytes]) -> None:
    png = png16(6000)
    before = rss_mb(pid)
    lines = [f"\nhostile: {args.hostile} slow clients and four 6000 x 6000 16-bit PNGs ({len(png) / 1024:.0f} KB) in "
             f"flight beside the honest clients; server RSS before {before:.0f} MB",
             "| honest clients | requests/s | search p50 / p99 ms | upload p50 / p99 ms | errors | slow clients got | "
             "16-bit PNG answers (s each) | peak RSS MB |", "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for count in [int(c) for c in args.clients.split(",")]:
        until = time.perf_counter() + args.seconds
        clients = [Client(port, until, sentences, images, args.image_share, args.seed + i) for i in range(count)]
        slow = SlowClients(port, until, args.hostile)
        uploads = [BigUploads(port, until, png) for _ in range(4)]
        peak = PeakRSS(pid, until + 5)
        for thread in [peak, slow, *uploads, *clients]:
            thread.start()
        for thread in [slow, *uploads, *clients, peak]:
            thread.join(args.seconds + 130)
        search = [x for c in clients for x in c.latencies["search"]]
        upload = [x for c in clients for x in c.latencies["image"]]
        errors = [e for c in clients for e in c.errors]
        answers: dict[int, int] = {}
        for u in uploads:
            for code, n in u.answers.items():
                answers[code] = answers.get(code, 0) + n
        seconds = [s for u in uploads for s in u.seconds]
        lines.append(f"| {count} | {(len(search) + len(upload)) / args.seconds:.1f} | "
                     f"{1000 * percentile(search, 0.5):.1f} / {1000 * percentile(search, 0.99):.1f} | "
                     f"{1000 * percentile(upload, 0.5):.1f} / {1000 * percentile(upload, 0.99):.1f} | {len(errors)} | "
                     f"{', '.join(f'{n} x {c}' for c, n in sorted(slow.statuses.items())) or 'nothing yet'} | "
                     f"{', '.join(f'{n} x {c}' for c, n in sorted(answers.items()))} "
                     f"({statistics.median(seconds) if seconds else float('nan'):.2f}) | {peak.peak:.0f} |")  # fmt: skip
        print(lines[-1], flush=True)
        kinds: dict[str, int] = {}
        for error in errors:  # "search 503 ..." / "image 503 ...": which requests were turned away
            kind = " ".join(str(error).split()[:2])
            kinds[kind] = kinds.get(kind, 0) + 1
        print(f"    errors by request and answer: {kinds or 'none'}")
        for error in errors[:3]:
            print(f"    e.g. {error}")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
