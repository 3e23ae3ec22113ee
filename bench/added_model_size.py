"""What languages added to a model cost: each branch's words, n-grams, width and stored
bytes, the model file, the folder `mule export` writes (with its ONNX towers), and the
memory of `mule serve` holding it, the base beside.

    python bench/added_model_size.py --workdir W --dataset multi30k --models model model+es+id+ja+ru+zh

Each model is exported with `mule export --model-file` into a temporary folder, and served
with `mule serve --version N` (the registered version of that file) until /api/info
answers; its resident memory is read from /proc then.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import torch
from stage_times import cpu_model  # bench/ is on the path


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def branches(path: Path) -> dict[str, dict]:
    data = torch.load(path, map_location="cpu", weights_only=True)
    out = {}
    for lang in data["languages"]:
        words = data["state_dict"][f"branches.{lang}.embed.weight"]
        grams = data["state_dict"].get(f"branches.{lang}.subwords.vectors.weight")
        stored = sum(t.numel() * t.element_size() for n, t in data["state_dict"].items() if n.startswith(f"branches.{lang}."))
        out[lang] = {"words": words.shape[0] - 2, "ngrams": 0 if grams is None else grams.shape[0] - 1,
                     "width": words.shape[1], "dtype": str(words.dtype).removeprefix("torch."), "bytes": stored,
                     "added": lang in (data.get("added_languages") or [])}  # fmt: skip
    return out


def version_of(workdir: Path, dataset: str, path: Path) -> str | None:
    """The registered version whose model is this file (by the weights' digest)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from mule.data_catalog.model_files import model_digest
    from mule.experiments import tracking
    from mule.storage.workdir import Workdir

    digest = model_digest(path)
    client = tracking.client(Workdir.at(workdir))
    for version in client.search_model_versions(f"name = 'mule-{dataset}'"):
        if version.tags.get("mule.model_identity") == digest:
            return str(version.version)
    return None


def served_memory(workdir: Path, dataset: str, version: str, port: int) -> dict:
    command = [sys.executable, "-m", "mule.commands", "serve", "--workdir", str(workdir), "--dataset", dataset,
               "--version", version, "--port", str(port), "--reload", "0"]  # fmt: skip
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    started = time.perf_counter()
    try:
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/info", timeout=5) as answer:
                    info = json.load(answer)
                break
            except OSError:
                if server.poll() is not None or time.perf_counter() - started > 600:
                    raise SystemExit(f"mule serve {version} did not start") from None
                time.sleep(1)
        status = Path(f"/proc/{server.pid}/status").read_text()
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        kib = {k: int(fields[k].split()[0]) for k in ("VmRSS", "VmHWM")}
        return {"rss_mib": kib["VmRSS"] / 1024, "peak_mib": kib["VmHWM"] / 1024, "images": info["images"],
                "start_s": round(time.perf_counter() - started, 1)}  # fmt: skip
    finally:
        server.terminate()
        server.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--dataset", default="multi30k")
    parser.add_argument("--models", nargs="+", default=["model"])
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--no-serve", action="store_true")
    parser.add_argument("--out", help="a JSON file of the figures")
    args = parser.parse_args()
    workdir = Path(args.workdir)
    print(f"CPU: {cpu_model()}, {os.cpu_count()} cores")
    rows = []
    for name in args.models:
        path = workdir / "models" / args.dataset / f"{name}.pt"
        parts = branches(path)
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "export"
            subprocess.run([sys.executable, "-m", "mule.commands", "export", "--model-file", str(path), "--out",
                            str(out)], check=True, stdout=subprocess.DEVNULL)  # fmt: skip
            exported = folder_bytes(out)
            onnx = {p.name: p.stat().st_size for p in (out / "textual").glob("*.onnx")}
        row = {"model": name, "file": path.stat().st_size, "export": exported, "text_towers": onnx, "branches": parts}
        version = None if args.no_serve else version_of(workdir, args.dataset, path)
        if version:
            row["serve"] = served_memory(workdir, args.dataset, version, args.port)
        rows.append(row)
    print("\n| language | words | n-grams | width | stored as | MiB |")
    print("|---|---|---|---|---|---|")
    for lang, b in rows[-1]["branches"].items():
        print(f"| {lang}{' (added)' if b['added'] else ''} | {b['words']:,} | {b['ngrams']:,} | {b['width']} | "
              f"{b['dtype']} | {b['bytes'] / 2**20:.1f} |")
    print("\n| model | file MiB | export MiB (textual/model.onnx) | mule serve RSS MiB (peak) |")
    print("|---|---|---|---|")
    for row in rows:
        served = row.get("serve")
        memory = f"{served['rss_mib']:.0f} ({served['peak_mib']:.0f})" if served else "–"
        print(f"| {row['model']} | {row['file'] / 2**20:.0f} | {row['export'] / 2**20:.0f} "
              f"({row['text_towers'].get('model.onnx', 0) / 2**20:.0f}) | {memory} |")
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1, default=str))


if __name__ == "__main__":
    main()
