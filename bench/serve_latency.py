"""`mule serve` as the gallery grows: warm query latency over HTTP, start-up and memory.

    python bench/serve_latency.py --model WORKDIR/models/embedded/model.pt [--sizes 1000,31000,100000]

For each size, a gallery of that many images (random CNN features pushed through the
model's image branch, as `mule serve` does with the catalog's at start-up) is served by
the real app (serving/app.py) under uvicorn on loopback, and sentence queries (language
detected, k=10) are sent one at a time from this process: the figures are what a user's
request waits, HTTP included. Prints, per size: time to embed the gallery, its memory,
the process's resident memory, and the latency's median, 95th percentile and max over
--queries warm queries (after --warmup ones).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import sys
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

QUERIES = ["a red circle at the top", "two blue squares on the left", "ein grüner Kreis in der Mitte",
           "un triangle jaune en bas", "a small heart near the center", "zwei rote Dreiecke"]  # fmt: skip


def rss_mib() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(app, port: int):
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    return server, thread


def paper_shaped(embedder):
    """The same vocabularies and image features in an untrained model of the paper's sizes."""
    import dataclasses

    from mule.config.resolution import resolve
    from mule.mule_core.embedder import Embedder
    from mule.mule_core.model import MuleModel

    meta = dict(embedder.meta)
    paper = resolve("paper", {})
    meta["cfg"] = dataclasses.replace(meta["cfg"], model=paper.model)
    sizes = {lang: len(v) for lang, v in meta["vocabulary"].vocabs.items()}
    model = MuleModel(
        meta["languages"], sizes, meta["word_dim"], meta["image_dim"], paper.model, meta["vocabulary"].words
    )
    return Embedder(model.eval(), meta, "untrained, paper-sized", embedder.device, embedder.load_network,
                    embedder.open_image)  # fmt: skip


def image_queries(port: int, embedder, n: int) -> list[float]:
    import io

    import numpy as np
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (480, 640, 3), dtype=np.uint8)).save(buffer, "JPEG")
    walls = []
    for i in range(n + 2):
        request = urllib.request.Request(f"http://127.0.0.1:{port}/api/image?k=5", buffer.getvalue(), method="POST")
        t = time.perf_counter()
        with urllib.request.urlopen(request) as response:
            json.loads(response.read())
        if i >= 2:
            walls.append(1000 * (time.perf_counter() - t))
    return walls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="a trained model file (WORKDIR/models/<dataset>/model.pt)")
    parser.add_argument("--sizes", default="1000,31000,100000")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--shape", choices=["model", "paper"], default="model",
                        help="paper: an untrained model of the paper preset's sizes (512-d shared space, 1024-d "
                        "LSTM) with the model file's vocabularies; latency depends on sizes, not on training")  # fmt: skip
    args = parser.parse_args()

    import torch

    from mule.api.from_file import open_embedder
    from mule.serving.app import create_app
    from mule.serving.gallery import synthetic_gallery

    embedder = open_embedder(Path(args.model))
    if args.shape == "paper":
        embedder = paper_shaped(embedder)
    print(f"shared space: {embedder.meta['cfg'].model.joint_dim}-d ({args.shape})")
    print(f"model: {args.model} ({embedder.languages}); torch threads {torch.get_num_threads()}")
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
          f"torch {torch.__version__}")  # fmt: skip
    print(
        "\n| images | embed gallery (s) | gallery MiB | process RSS MiB | median ms | p95 ms | max ms | server ms (median) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    sizes = [int(s) for s in args.sizes.split(",")]
    embedder.warm_up()
    for size in sizes:
        started = time.perf_counter()
        gallery = synthetic_gallery(embedder, size)
        embed_s = time.perf_counter() - started
        port = free_port()
        server, thread = serve(create_app(embedder, gallery), port)
        walls, inside = [], []
        for i in range(args.warmup + args.queries):
            query = urllib.parse.urlencode({"q": QUERIES[i % len(QUERIES)], "k": 10})
            t = time.perf_counter()
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/search?{query}") as response:
                body = json.loads(response.read())
            if i >= args.warmup:
                walls.append(1000 * (time.perf_counter() - t))
                inside.append(body["ms"])
        assert body["gallery"] == size and len(body["results"]) == 10
        walls.sort()
        print(f"| {size:,} | {embed_s:.2f} | {gallery.nbytes / 2**20:.1f} | {rss_mib():.0f} | "
              f"{statistics.median(walls):.2f} | {walls[int(0.95 * len(walls)) - 1]:.2f} | {walls[-1]:.2f} | "
              f"{statistics.median(inside):.2f} |", flush=True)  # fmt: skip
        if size == sizes[0]:
            image_ms = image_queries(port, embedder, args.queries // 10)
        server.should_exit = True
        thread.join(timeout=10)
        del gallery
    print(
        f"\nimage query (a 640x480 JPEG upload -> extractor -> sentences; gallery {sizes[0]:,} images, no captions): "
        f"median {statistics.median(image_ms):.1f} ms, max {max(image_ms):.1f} ms over {len(image_ms)}"
    )


if __name__ == "__main__":
    main()
