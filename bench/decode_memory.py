"""What decoding one query image costs in memory: each kind of large image decoded the
way `mule serve` decodes an upload (datasets.image_files.load_rgb, a 256-px crop's shorter
side, the default 40 MP budget), each in a fresh process; its peak resident memory above
the process's before, against the bytes the image's first frame decodes to (the budget
checked from its header).

    python bench/decode_memory.py [--side 6000] [--python PY --repo DIR]

--python / --repo: another checkout's mule (a worktree of the last landed commit).
"""

from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, sys, types
package = types.ModuleType("mule"); package.__path__ = [sys.argv[2]]; sys.modules["mule"] = package
from mule.datasets.image_files import load_rgb
import PIL.Image, numpy
PIL.Image.init()
data = open(sys.argv[1], "rb").read()

def status(field):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))

with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # the peak resident size starts again from now (Linux)
before = status("VmRSS")
image = load_rgb(data, min_side=256, max_pixels=40_000_000, max_bytes=120_000_000)
print(json.dumps({"growth_mb": (status("VmHWM") - before) / 1024, "size": image.size}))
"""


def images(side: int, folder: Path) -> dict[str, Path]:
    """The kinds of large image a server is sent, each side x side pixels."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    out = {}
    noise = rng.integers(0, 256, (side, side, 3), np.uint8)
    kinds = {
        "RGB BMP (uncompressed)": (Image.fromarray(noise), "BMP", {}),
        "RGB JPEG": (Image.fromarray(noise), "JPEG", {"quality": 80}),
        "RGB JPEG, EXIF orientation 6": (Image.fromarray(noise), "JPEG", {"quality": 80, "exif": _rotated()}),
        "16-bit grey PNG": (Image.fromarray((np.arange(side * side, dtype=np.uint32) % 65536).astype(np.uint16)
                                            .reshape(side, side)), "PNG", {}),  # fmt: skip
        "RGBA PNG (4/5 the side: 4 bytes a pixel)": (Image.fromarray(np.dstack([noise, noise[..., :1]])[: side * 4 // 5,
                                                      : side * 4 // 5].copy()), "PNG", {"compress_level": 1}),  # fmt: skip
    }
    for name, (image, form, options) in kinds.items():
        path = folder / (name.split()[0] + "-" + form + "-" + str(len(out)))
        buffer = io.BytesIO()
        image.save(buffer, form, **options)
        path.write_bytes(buffer.getvalue())
        out[name] = path
    return out


def _rotated():
    from PIL import Image

    exif = Image.Exif()
    exif[0x0112] = 6
    return exif.tobytes()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--side", type=int, default=6000)
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--repo", type=Path, default=REPO)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        made = images(args.side, Path(folder))
        print(f"| image ({args.side} x {args.side}, {args.side**2 / 1e6:.0f} MP) | file MB | decodes to MB | "
              f"peak growth MB ({args.repo}) | growth / decoded | result |")  # fmt: skip
        print("|---|---|---|---|---|---|")
        for name, path in made.items():
            from PIL import Image

            with Image.open(path) as image:
                from mule.datasets.image_files import decoded_bytes

                decoded = decoded_bytes(image) / 2**20
            done = subprocess.run([args.python, "-c", CHILD, str(path), str(args.repo)], capture_output=True, text=True)
            if done.returncode != 0:
                print(f"| {name} | {path.stat().st_size / 2**20:.2f} | {decoded:.0f} | failed: "
                      f"{done.stderr.strip().splitlines()[-1][:80]} | | |")  # fmt: skip
                continue
            figures = json.loads(done.stdout)
            print(f"| {name} | {path.stat().st_size / 2**20:.2f} | {decoded:.0f} | {figures['growth_mb']:.0f} | "
                  f"{figures['growth_mb'] / decoded:.2f}x | {figures['size'][0]} x {figures['size'][1]} |")  # fmt: skip


if __name__ == "__main__":
    main()
