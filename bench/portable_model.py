"""The registered model where mule is not: download the champion, build a fresh venv from
nothing but the model's own requirements.txt, predict there, and serve it with
`mlflow models serve` from that venv; the vectors must equal mule's own.

    python bench/portable_model.py [--workdir DIR] [--out DIR] [--env-manager uv|virtualenv]

--workdir: a workdir with a champion (default: a tiny demo workdir built first, ~1 min).
--out: where the model, the venv and the request go (default: a temporary folder, kept).
--env-manager: also serve with `mlflow models serve --env-manager uv|virtualenv` (MLflow
builds its own environment from the model's requirements; needs uv, or pyenv+virtualenv).

Outside the default test run: it installs torch into a new venv (minutes, ~1.5 GB). The
venv is made by the system's python3 with no access to mule's checkout or venv: the model
carries mule's code itself (code_paths) and the extractor's weights.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
TINY = ["--train-images", "48", "--val-images", "16", "--test-images", "24", "--set", "data.image_size=48",
        "--set", "features.input_size=32", "--set", "vectors.fasttext_epochs=3", "--set", "pretrain.epochs=2",
        "--set", "train.epochs=4"]  # fmt: skip

PREDICT = r"""
import base64, json, sys
import mlflow.pyfunc, pandas as pd
request = json.load(open(sys.argv[2]))
model = mlflow.pyfunc.load_model(sys.argv[1])
rows = pd.DataFrame({"text": request["text"] + [None], "lang": request["lang"] + [None],
                     "image": [None] * len(request["text"]) + [base64.b64decode(request["image"])]})
out = model.predict(rows)
print(json.dumps({"mule_importable_from": [m.__file__ for m in [__import__("mule.serving.mlflow_model").serving.mlflow_model]],
                  "rows": out.to_dict("records")}))
"""


def step(what: str, command: list[str], **kw) -> subprocess.CompletedProcess:
    started = time.perf_counter()
    shown = [c if "\n" not in c else "<script>" for c in command]
    print(f"$ {' '.join(shown)}", flush=True)
    done = subprocess.run(command, capture_output=True, text=True, **kw)
    if done.returncode != 0:
        sys.exit(f"{what} failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
    print(f"  {what}: {time.perf_counter() - started:.1f} s", flush=True)
    return done


def champion(workdir: Path, out: Path) -> Path:
    import mlflow

    from mule.storage.workdir import Workdir

    wd = Workdir.at(workdir)
    mlflow.set_tracking_uri(wd.mlflow_uri)
    target = out / "model"
    shutil.rmtree(target, ignore_errors=True)
    path = mlflow.artifacts.download_artifacts(artifact_uri="models:/mule-embedded@champion", dst_path=str(target))
    return Path(path)


def expected(model: Path, request: dict) -> list[list[float]]:
    """The vectors of mule's own code (this checkout, in this venv)."""
    import yaml

    from mule.api.from_file import open_embedder

    artifacts = yaml.safe_load((model / "MLmodel").read_text())["flavors"]["python_function"]["artifacts"]
    embedder = open_embedder(model / artifacts["model"]["path"],
                             weights_file=str(model / artifacts["extractor_weights"]["path"])
                             if "extractor_weights" in artifacts else None)  # fmt: skip
    texts = list(embedder.encode_text(request["text"], request["lang"]))
    return [*texts, embedder.encode_image(base64.b64decode(request["image"]))[0]]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_and_ask(command: list[str], port: int, request: dict, env: dict, cwd: Path, timeout: float) -> list[dict]:
    print(f"$ {' '.join(command)}", flush=True)
    started = time.perf_counter()
    log = open(cwd / f"serve-{port}.log", "w")
    server = subprocess.Popen(command, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + timeout
        while True:
            if server.poll() is not None:
                sys.exit(f"the server exited with {server.returncode}: {(cwd / f'serve-{port}.log').read_text()[-4000:]}")
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/ping", timeout=2).close()
                break
            except OSError:
                if time.time() > deadline:
                    sys.exit(f"nothing answered on port {port} within {timeout:.0f} s")
                time.sleep(1)
        print(f"  up after {time.perf_counter() - started:.1f} s", flush=True)
        # sentences and images in separate requests: MLflow's JSON reader cannot base64-decode
        # a binary column that has empty cells (TypeError: encoding without a string argument)
        texts = {"dataframe_split": {"columns": ["text", "lang"], "data": [list(r) for r in zip(request["text"], request["lang"])]}}
        images = {"dataframe_split": {"columns": ["image"], "data": [[request["image"]]]}}
        return [*post(port, texts), *post(port, images)]
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()


def post(port: int, body: dict) -> list[dict]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/invocations", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=120) as answer:
            return json.loads(answer.read())["predictions"]
    except urllib.error.HTTPError as error:
        sys.exit(f"the server answered {error.code}: {error.read()[:1000]!r}")


def compare(what: str, rows: list[dict], want: list) -> None:
    got = np.array([r["embedding"] for r in rows], dtype=np.float32)
    gap = float(np.abs(got - np.array(want, dtype=np.float32)).max())
    print(f"  {what}: {len(rows)} rows ({', '.join(r['input'] + (':' + r['lang'] if r['lang'] else '') for r in rows)}); "
          f"largest difference from mule's own vectors {gap:.2e}", flush=True)  # fmt: skip
    if gap > 1e-4:
        sys.exit(f"{what}: the vectors differ from mule's own by {gap}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", type=Path)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--env-manager", choices=["uv", "virtualenv"])
    args = parser.parse_args()
    out = (args.out or Path(tempfile.mkdtemp(prefix="mule-portable-"))).resolve()
    out.mkdir(parents=True, exist_ok=True)
    workdir = args.workdir
    if workdir is None:
        workdir = out / "workdir"
        step("a tiny demo workdir", [str(Path(sys.executable).with_name("mule")), "demo", "--workdir", str(workdir), *TINY])
    model = champion(workdir, out)
    requirements = (model / "requirements.txt").read_text().split()
    print(f"the champion, downloaded to {model}: {sum(f.stat().st_size for f in model.rglob('*') if f.is_file()) / 2**20:.1f} MB")
    print(f"  requirements.txt: {' '.join(requirements)}")
    print(f"  code: {len(list((model / 'code').rglob('*.py')))} files under code/mule/")

    from mule.data_catalog.queries import image_paths
    from mule.data_catalog.tables import Catalog
    from mule.storage.workdir import Workdir

    image = next(iter(image_paths(Catalog(Workdir.at(workdir)), "embedded").values()))
    request = {"text": ["a red circle above a blue square", "ein roter Kreis"], "lang": [None, "de"],
               "image": base64.b64encode(Path(image).read_bytes()).decode()}  # fmt: skip
    (out / "request.json").write_text(json.dumps(request))
    want = expected(model, request)

    # a venv from the system's Python, not mule's: nothing of mule is installed in it
    python = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin") or "python3"
    venv = out / "venv"
    shutil.rmtree(venv, ignore_errors=True)
    step("python3 -m venv", [python, "-m", "venv", str(venv)])
    step("pip install -r requirements.txt", [str(venv / "bin" / "pip"), "install", "-q", "-r", str(model / "requirements.txt")])
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV", "MLFLOW_"))}
    clean["PATH"] = f"{venv / 'bin'}{os.pathsep}{clean.get('PATH', '')}"
    found = step("mule importable without the model?", [str(venv / "bin" / "python"), "-I", "-c",
                  "import importlib.util as u; print(u.find_spec('mule'))"], cwd=out, env=clean)  # fmt: skip
    print(f"  in the fresh venv, before loading the model, `mule` is: {found.stdout.strip()}")
    done = step("predict in the fresh venv", [str(venv / "bin" / "python"), "-I", "-c", PREDICT, str(model),
                                              str(out / "request.json")], cwd=out, env=clean)  # fmt: skip
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"  mule's code came from {answer['mule_importable_from'][0]}")
    compare("predict", answer["rows"], want)

    port = free_port()
    rows = serve_and_ask([str(venv / "bin" / "mlflow"), "models", "serve", "-m", str(model), "--env-manager", "local",
                          "-h", "127.0.0.1", "-p", str(port), "-w", "1"], port, request, clean, out, 300)  # fmt: skip
    compare("mlflow models serve (the fresh venv, --env-manager local)", rows, want)
    if args.env_manager:
        port = free_port()
        env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
        rows = serve_and_ask([str(Path(sys.executable).with_name("mlflow")), "models", "serve", "-m", str(model),
                              "--env-manager", args.env_manager, "-h", "127.0.0.1", "-p", str(port), "-w", "1"],
                             port, request, env, out, 900)  # fmt: skip
        compare(f"mlflow models serve --env-manager {args.env_manager}", rows, want)
    print(f"everything is in {out}")


if __name__ == "__main__":
    main()
