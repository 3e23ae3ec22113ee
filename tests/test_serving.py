"""The trained model where people use it: the registered MLflow pyfunc model (loaded in a
fresh process, and behind `mlflow models serve`), and `mule serve`'s JSON API and page
(in headless Chromium). All on the tiny rebuilt workdir (tests/conftest.py: rebuilt)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from data_catalog import queries
from data_catalog.catalog import Catalog
from tests import browser

MODEL_URI = "models:/mule-embedded@champion"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def served(rebuilt_as_built):
    """The searcher, gallery and app of the champion, and a caption whose own image the
    model ranks first among all the images (to look for in the results)."""
    from serving import gallery as galleries
    from serving import search
    from serving.app import create_app

    wd, _ = rebuilt_as_built
    searcher = search.open_searcher(wd, "embedded")
    gallery = galleries.load_gallery(searcher)
    embedder = search.embedder(searcher)
    english = gallery.captions["en"]
    hits = [i for i in range(len(english.ids))
            if gallery.top_images(english.vectors[i], 1)[0]["image_id"] == english.image_ids[i]]  # fmt: skip
    assert hits, "the tiny model ranks no English caption's own image first"
    caption = {"text": english.texts[hits[0]], "image_id": english.image_ids[hits[0]]}
    # and a test-split caption whose image is among the 10 the page shows first
    split = dict(zip(gallery.image_ids, gallery.splits))
    ranks = {i: [r["image_id"] for r in gallery.top_images(english.vectors[i], 10)].index(english.image_ids[i])
             for i in range(len(english.ids)) if split[english.image_ids[i]].startswith("test")
             and english.image_ids[i] in [r["image_id"] for r in gallery.top_images(english.vectors[i], 10)]}  # fmt: skip
    assert ranks, "no English test caption has its image among the 10 closest of the gallery"
    best = min(ranks, key=ranks.get)
    test_caption = {"text": english.texts[best], "image_id": english.image_ids[best]}
    app = create_app(embedder, gallery, max_upload_bytes=64 * 1024, dataset="embedded")
    return {"wd": wd, "searcher": searcher, "gallery": gallery, "embedder": embedder, "caption": caption,
            "test_caption": test_caption, "app": app}  # fmt: skip


@contextmanager
def only_the_mlflow_store(wd):
    """The workdir without what mule itself reads (models, catalog, raw files): what is
    left is MLflow's store, all a registered model may use."""
    moved = []
    try:
        for name in ("models", "catalog", "catalog.duckdb", "raw", "state"):
            if (wd.root / name).exists():
                (wd.root / name).rename(wd.root / f"{name}.hidden")
                moved.append(name)
        yield
    finally:
        for name in moved:
            (wd.root / f"{name}.hidden").rename(wd.root / name)


def _image_file(wd, image_id: str) -> Path:
    return Path(queries.image_paths(Catalog(wd), "embedded")[image_id])


@pytest.mark.slow
def test_the_registered_model_embeds_sentences_and_images_in_a_fresh_process(served, tmp_path):
    import mlflow

    wd, caption = served["wd"], served["caption"]
    mlflow.set_tracking_uri(wd.mlflow_uri)
    info = mlflow.models.get_model_info(MODEL_URI)
    assert info.signature.inputs.input_names() == ["text", "lang", "image", "image_path"]
    assert "embedding" in info.signature.outputs.input_names()
    assert info.saved_input_example_info is not None  # an example a user can copy
    image = tmp_path / "photo.jpg"
    image.write_bytes(_image_file(wd, caption["image_id"]).read_bytes())
    german = served["gallery"].captions["de"].texts[0]
    script = f"""
import json, sys
import mlflow, pandas as pd
model = mlflow.pyfunc.load_model({MODEL_URI!r})
rows = pd.DataFrame({{"text": [{caption["text"]!r}, {german!r}, None, None], "lang": [None, "de", None, None],
                     "image": [None, None, open({str(image)!r}, "rb").read(), None],
                     "image_path": [None, None, None, {str(image)!r}]}})
out = model.predict(rows)
assert "prefect" not in sys.modules, "the registered model imported Prefect"
print(json.dumps(out.to_dict("records")))
"""
    env = {**os.environ, "MLFLOW_TRACKING_URI": wd.mlflow_uri}
    with only_the_mlflow_store(wd):
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=180,
                              cwd=tmp_path, env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads(done.stdout.strip().splitlines()[-1])
    assert [r["input"] for r in rows] == ["text", "text", "image", "image"]
    assert rows[0]["lang"] == "en" and rows[0]["language"].startswith("detected: en")
    assert rows[1]["lang"] == "de" and rows[1]["language"] == "given"
    vectors = np.array([r["embedding"] for r in rows], dtype=np.float32)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert np.allclose(vectors[2], vectors[3], atol=1e-6)  # bytes or path: the same image
    # the same vectors as mule's own code gives, and the caption is closest to its image
    embedder = served["embedder"]
    assert np.allclose(vectors[0], embedder.text(caption["text"]).vector, atol=1e-5)
    assert np.allclose(vectors[2], embedder.image(image), atol=1e-5)
    gallery = served["gallery"]
    assert gallery.top_images(vectors[0], 1)[0]["image_id"] == caption["image_id"]


def test_the_pyfunc_model_embeds_a_table_in_batches_and_names_a_bad_row(served):
    import pandas as pd
    from mlflow.exceptions import MlflowException

    from serving.mlflow_model import MuleEmbeddings

    model = MuleEmbeddings()
    model.embedder = served["embedder"]
    captions = served["gallery"].captions
    texts = captions["en"].texts[:3] + captions["de"].texts[:3] + captions["cs"].texts[:2]
    out = model.predict(None, pd.DataFrame({"text": texts}))
    assert list(out["lang"]) == ["en"] * 3 + ["de"] * 3 + ["cs"] * 2  # each detected
    alone = np.stack([served["embedder"].text(t).vector for t in texts])
    assert np.allclose(np.stack(out["embedding"].map(np.asarray)), alone, atol=1e-5)  # batched = one by one
    with pytest.raises(MlflowException, match="row 3: the sentence is empty"):
        model.predict(None, pd.DataFrame({"text": [texts[0], texts[1], "  "]}))
    with pytest.raises(MlflowException, match="row 2: give exactly one of text, image"):
        model.predict(None, pd.DataFrame({"text": [texts[0], None], "image_path": [None, None]}))


def test_mule_serve_never_imports_the_orchestrator(served):
    """mule serve as the command runs it, up to the moment its server would start: the
    champion, the gallery and the extractor are loaded, and Prefect was never imported."""
    script = ("import sys, uvicorn\n"
              "def run(app, **kw): print('routes', len(app.routes), 'prefect imported:', 'prefect' in sys.modules)\n"
              "uvicorn.run = run\n"
              "from flows.cli import main\n"
              "sys.exit(main(sys.argv[1:]))\n")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", script, "serve", "--workdir", str(served["wd"].root)],
                          capture_output=True, text=True, timeout=180)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "88 images" in done.stdout and "prefect imported: False" in done.stdout, done.stdout


@pytest.mark.slow
def test_mlflow_models_serve_answers_sentences_on_loopback(served, tmp_path):
    wd, caption = served["wd"], served["caption"]
    port = free_port()
    # as a user runs it, in the activated environment: MLflow starts `uvicorn` by name
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    env = {**os.environ, "MLFLOW_TRACKING_URI": wd.mlflow_uri, "PATH": path}
    command = [sys.executable, "-m", "mlflow", "models", "serve", "-m", MODEL_URI, "--env-manager", "local",
               "-h", "127.0.0.1", "-p", str(port), "-w", "1"]  # fmt: skip
    with only_the_mlflow_store(wd):
        server = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        try:
            _wait_for(f"http://127.0.0.1:{port}/ping", server, 150)
            body = {"dataframe_split": {"columns": ["text", "lang"], "data": [[caption["text"], None], ["ein Kreis", "de"]]}}
            status, answer = _post_json(f"http://127.0.0.1:{port}/invocations", body)
            assert status == 200, answer
            predictions = answer["predictions"]
            assert [p["lang"] for p in predictions] == ["en", "de"]
            vector = np.array(predictions[0]["embedding"], dtype=np.float32)
            assert np.allclose(vector, served["embedder"].text(caption["text"]).vector, atol=1e-5)
            status, answer = _post_json(f"http://127.0.0.1:{port}/invocations",
                                        {"dataframe_split": {"columns": ["text"], "data": [["xyzzy qwrtp"]]}})  # fmt: skip
            assert status == 400 and "row 1" in json.dumps(answer), answer
        finally:
            server.terminate()
            server.wait(timeout=30)


def test_the_search_api_answers_and_says_what_is_wrong_with_a_bad_request(served, tmp_path):
    from fastapi.testclient import TestClient

    client = TestClient(served["app"])
    caption, gallery = served["caption"], served["gallery"]
    found = client.get("/api/search", params={"q": caption["text"], "k": 3}).json()
    assert found["lang"] == "en" and found["language"].startswith("detected: en")
    assert found["results"][0]["image_id"] == caption["image_id"]
    assert found["results"][0]["url"] == f"/images/{caption['image_id']}"
    assert found["gallery"] == len(gallery.image_ids) == 88
    picture = client.get(found["results"][0]["url"])
    assert picture.status_code == 200 and picture.content == _image_file(served["wd"], caption["image_id"]).read_bytes()
    image = _image_file(served["wd"], caption["image_id"]).read_bytes()
    sentences = client.post("/api/image", params={"k": 2}, content=image).json()["results"]
    assert list(sentences) == ["en", "de", "fr", "cs"] and all(len(rows) == 2 for rows in sentences.values())
    info = client.get("/api/info").json()
    assert info["languages"] == ["en", "de", "fr", "cs"] and info["images"] == 88

    def refused(response, status: int, words: str) -> None:
        assert response.status_code == status, response.text
        assert words in response.json()["error"], response.json()
        assert "Traceback" not in response.text

    refused(client.get("/api/search", params={"q": "   "}), 400, "the sentence is empty")
    refused(client.get("/api/search", params={"q": "ein Bild", "lang": "ja"}), 400, "does not know 'ja'")
    refused(client.get("/api/search", params={"q": "xyzzy qwrtp"}), 400, "none of the words")
    refused(client.get("/api/search", params={"q": "a dog", "k": 0}), 400, "k must be between 1 and 100")
    refused(client.get("/api/search", params={"q": "a dog", "k": "many"}), 400, "k: ")
    refused(client.get("/api/search", params={"q": "a " * 600}), 413, "at most 1,000")
    refused(client.post("/api/image", content=b"GIF89a not really"), 415, "not an image that can be read")
    refused(client.post("/api/image", content=b""), 400, "the request's body is empty")
    refused(client.post("/api/image", content=b"\xff" * (64 * 1024 + 1)), 413, "at most 65,536")
    # Only the catalog's images, by id: nothing in a request is a path.
    secret = tmp_path / "secret.jpg"
    secret.write_bytes(image)
    for attempt in ("../../../../etc/passwd", "..%2F..%2Fetc%2Fpasswd", str(secret), "%2Fetc%2Fpasswd",
                    f"..%2F{caption['image_id']}", "train-000000.jpg"):  # fmt: skip
        response = client.get(f"/images/{attempt}")
        assert response.status_code == 404, (attempt, response.status_code)
        assert response.content != image and b"root:" not in response.content


@pytest.mark.slow
def test_the_search_page_in_a_real_browser(served, tmp_path):
    """`mule serve` as a user starts it; headless Chromium types a test caption and finds
    its image among the results, then gives it an image and gets sentences per language."""
    wd, caption = served["wd"], served["test_caption"]
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "flows.cli", "serve", "--workdir", str(wd.root), "--port",
                               str(port)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    try:
        _wait_for(f"http://127.0.0.1:{port}/api/info", server, 120)
        with browser.page() as page:
            page.goto(f"http://127.0.0.1:{port}/")
            page.wait_for_function("document.getElementById('info').textContent.includes('88 images')")
            page.fill("#q", caption["text"])
            page.press("#q", "Enter")
            page.wait_for_selector(f"figure[data-image-id='{caption['image_id']}']", timeout=20_000)
            assert "detected: en" in page.text_content("#status")
            assert page.locator("#results figure").count() == 10
            shown = page.locator(f"figure[data-image-id='{caption['image_id']}'] img").element_handle()
            # the picture itself loads (as a person waits for it: on a busy machine it comes after the figure)
            page.wait_for_function("img => img.complete && img.naturalWidth > 0", arg=shown, timeout=20_000)
            page.set_input_files("#file", str(_image_file(wd, caption["image_id"])))
            page.wait_for_selector("#sentences div[data-lang='cs'] li", timeout=20_000)
            assert page.locator("#sentences h3").all_text_contents() == ["en", "de", "fr", "cs"]
            page.screenshot(path=str(tmp_path / "serve.png"), full_page=True)
            _keep_screenshot(tmp_path / "serve.png")
            page.fill("#q", "xyzzy qwrtp")
            page.press("#q", "Enter")
            page.wait_for_selector("#status.error")
            assert "none of the words" in page.text_content("#status")
        # SIGTERM (a container stop): it goes within 2 s, says so in one line, frees the port
        sent = time.monotonic()
        server.send_signal(signal.SIGTERM)
        rest = server.communicate(timeout=20)[0]
        assert server.returncode == 143 and time.monotonic() - sent < 3.0, rest
        assert rest.strip().splitlines()[-1] == f"mule serve: stopped by SIGTERM; port {port} is free"
        assert "Traceback" not in rest
        with socket.socket() as sock:  # free again for the next server (the browser's closed connections linger)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("127.0.0.1", port))
    finally:
        if server.poll() is None:
            server.kill()
            server.wait(timeout=20)


def _keep_screenshot(path: Path) -> None:
    """MULE_SCREENSHOTS=DIR keeps the page's screenshot (the README's comes from here)."""
    folder = os.environ.get("MULE_SCREENSHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        (Path(folder) / path.name).write_bytes(path.read_bytes())


def _wait_for(url: str, process: subprocess.Popen, timeout: float) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if process.poll() is not None:
            output = process.stdout.read() if process.stdout else ""
            pytest.fail(f"the server exited with {process.returncode}:\n{str(output)[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.3)
    pytest.fail(f"nothing answered at {url} within {timeout:.0f} s")


def _post_json(url: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"{}")
