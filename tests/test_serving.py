"""The trained model where people use it: the registered MLflow pyfunc model (loaded in a
fresh process, and behind `mlflow models serve`), and `mule serve`'s JSON API and page
(in headless Chromium). All on the tiny rebuilt workdir (tests/conftest.py: rebuilt)."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from mule.data_catalog import queries
from mule.data_catalog.tables import Catalog
from tests import browser

MODEL_URI = "models:/mule-embedded@champion"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


DOCS_TAKE_AWAY = Path(__file__).resolve().parents[1] / "docs" / "take-away.md"
SEED = 20261124  # the queries the serving tests ask: drawn from the test split by this seed


@pytest.fixture(scope="module")
def served(rebuilt_as_built):
    """The searcher, gallery and app of the champion, and a caption of the test split
    drawn by a seed (never chosen by the model's own ranking)."""
    from mule.serving import gallery as galleries
    from mule.serving import retrieval
    from mule.serving.app import Limits, create_app

    wd, results = rebuilt_as_built
    searcher = retrieval.open_searcher(wd, "embedded")
    gallery = galleries.load_gallery(searcher)
    embedder = retrieval.embedder(searcher)
    english = gallery.captions["en"]
    split = dict(zip(gallery.image_ids, gallery.splits))
    test_rows = [i for i in range(len(english.ids)) if split[english.image_ids[i]].startswith("test")]
    drawn = int(np.random.default_rng(SEED).choice(test_rows))
    caption = {"text": english.texts[drawn], "image_id": english.image_ids[drawn]}
    app = create_app(embedder, gallery, "embedded", Limits(max_upload_bytes=64 * 1024))
    return {"wd": wd, "results": results, "searcher": searcher, "gallery": gallery, "embedder": embedder,
            "caption": caption, "app": app}  # fmt: skip


def client(app, host: str = "127.0.0.1:8000"):
    """FastAPI's TestClient, as a browser on this machine asks (the server checks the Host)."""
    from fastapi.testclient import TestClient

    return TestClient(app, base_url=f"http://{host}")


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


def captions_outside_the_vocabulary(served) -> tuple[list[tuple[str, str]], list[int], np.ndarray, np.ndarray]:
    """Test captions with words no training caption has, as (text, lang); their rows in
    the test split, the evaluate stage's vectors (its loader and encoder) of the split, and
    the rows whose words outside the vocabulary are composed from n-grams."""
    import torch

    from mule.data_catalog.splits import load_split
    from mule.mule_core.encoding import encode_split

    wd, searcher = served["wd"], served["searcher"]
    vocabulary, catalog = searcher.meta["vocabulary"], Catalog(wd)
    data = load_split(catalog, "embedded", "test", vocabulary, searcher.meta["cfg"].text.max_tokens)
    evaluated = encode_split(searcher.model, data, torch.device("cpu"))["caption_joint"].numpy()
    sizes = np.array([vocabulary.sizes[data.languages[i]] for i in data.caption_lang])
    composed = np.nonzero((data.tokens.numpy() >= sizes[:, None]).any(1))[0]
    unknown = np.nonzero((data.tokens.numpy() == 1).any(1))[0]
    rows = [int(r) for r in [*composed[:12], *unknown[:4]]]
    assert len(composed) >= 10, "the tiny test split should hold captions with words outside the vocabulary"
    texts = queries.caption_texts(catalog, "embedded", [data.caption_ids[r] for r in rows])
    sentences = [(texts[data.caption_ids[r]], data.languages[data.caption_lang[r]]) for r in rows]
    return sentences, rows, evaluated, composed


@pytest.fixture(scope="module")
def fresh_process(served, tmp_path_factory):
    """What the registered model answers in a fresh process that has only MLflow's store:
    an English and a German caption, an image as bytes and as a path (a path only with an
    allowed folder, given when the model is loaded), and the captions of
    captions_outside_the_vocabulary. One process for the two tests that read it: its
    imports (torch, MLflow, pandas) are most of its cost. "outside" is what
    captions_outside_the_vocabulary returned."""
    wd, caption = served["wd"], served["caption"]
    folder = tmp_path_factory.mktemp("fresh-process")
    image = folder / "photo.jpg"
    image.write_bytes(_image_file(wd, caption["image_id"]).read_bytes())
    german = served["gallery"].captions["de"].texts[0]
    outside = captions_outside_the_vocabulary(served)
    sentences = outside[0]
    script = f"""
import json, sys
import mlflow, pandas as pd
model = mlflow.pyfunc.load_model({MODEL_URI!r})
rows = pd.DataFrame({{"text": [{caption["text"]!r}, {german!r}, None], "lang": [None, "de", None],
                     "image": [None, None, open({str(image)!r}, "rb").read()]}})
out = model.predict(rows)
allowed = mlflow.pyfunc.load_model({MODEL_URI!r}, model_config={{"image_root": {str(folder)!r}}})
out = pd.concat([out, allowed.predict(pd.DataFrame({{"image_path": ["photo.jpg"]}}))], ignore_index=True)
captions = model.predict(pd.DataFrame({{"text": {[t for t, _ in sentences]!r}, "lang": {[lang for _, lang in sentences]!r}}}))
assert "prefect" not in sys.modules, "the registered model imported Prefect"
print(json.dumps({{"mixed": out.to_dict("records"), "captions": captions["embedding"].tolist()}}))
"""
    env = {**os.environ, "MLFLOW_TRACKING_URI": wd.mlflow_uri}
    with only_the_mlflow_store(wd):
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=180,
                              cwd=folder, env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return {"image": image, "outside": outside, **json.loads(done.stdout.strip().splitlines()[-1])}


@pytest.mark.slow
def test_the_registered_model_embeds_sentences_and_images_in_a_fresh_process(served, fresh_process):
    import mlflow

    wd, caption = served["wd"], served["caption"]
    mlflow.set_tracking_uri(wd.mlflow_uri)
    info = mlflow.models.get_model_info(MODEL_URI)
    assert info.signature.inputs.input_names() == ["text", "lang", "image", "image_path"]
    assert "embedding" in info.signature.outputs.input_names()
    assert info.saved_input_example_info is not None  # an example a user can copy
    rows = fresh_process["mixed"]
    assert [r["input"] for r in rows] == ["text", "text", "image", "image"]
    assert rows[0]["lang"] == "en" and rows[0]["language"].startswith("detected: en")
    assert rows[1]["lang"] == "de" and rows[1]["language"] == "given"
    vectors = np.array([r["embedding"] for r in rows], dtype=np.float32)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert np.allclose(vectors[2], vectors[3], atol=1e-6)  # bytes or path: the same image
    # the same vectors as mule's own code gives, and the caption is closest to its image
    embedder = served["embedder"]
    assert np.allclose(vectors[0], embedder.encode_text(caption["text"])[0], atol=1e-5)
    assert np.allclose(vectors[2], embedder.encode_image(fresh_process["image"])[0], atol=1e-5)


@pytest.mark.slow
def test_a_test_caption_is_one_vector_in_evaluation_in_mule_serve_and_in_the_registered_model(served,
        fresh_process):  # fmt: skip
    """Test captions with words no training caption has: the evaluate stage's vectors
    (its loader and encoder), `mule serve`'s (GET /api/embed) and the registered pyfunc
    model's in a fresh process are the same numbers, words outside the vocabulary included."""
    sentences, rows, evaluated, composed = fresh_process["outside"]  # the captions the fresh process was asked
    api = client(served["app"])
    for (text, lang), row in zip(sentences, rows):
        answer = api.get("/api/embed", params={"q": text, "lang": lang}).json()
        assert np.allclose(answer["vector"], evaluated[row], atol=1e-5), (text, lang)
        if row in composed:
            assert answer["composed_words"], text
    served_vectors = np.array(fresh_process["captions"], dtype=np.float32)
    assert np.allclose(served_vectors, evaluated[rows], atol=1e-5)


def test_the_pyfunc_model_embeds_a_table_in_batches_and_names_a_bad_row(served):
    import pandas as pd
    from mlflow.exceptions import MlflowException

    from mule.serving.mlflow_model import MuleEmbeddings

    model = MuleEmbeddings()
    model.embedder = served["embedder"]
    captions = served["gallery"].captions
    texts = captions["en"].texts[:3] + captions["de"].texts[:3] + captions["cs"].texts[:2]
    out = model.predict(None, pd.DataFrame({"text": texts}))
    assert list(out["lang"]) == ["en"] * 3 + ["de"] * 3 + ["cs"] * 2  # each detected
    alone = np.stack([served["embedder"].encode_text(t)[0] for t in texts])
    assert np.allclose(np.stack(out["embedding"].map(np.asarray)), alone, atol=1e-5)  # batched = one by one
    with pytest.raises(MlflowException, match="row 3: the sentence is empty"):
        model.predict(None, pd.DataFrame({"text": [texts[0], texts[1], "  "]}))
    with pytest.raises(MlflowException, match="row 2: give exactly one of text, image"):
        model.predict(None, pd.DataFrame({"text": [texts[0], None], "image_path": [None, None]}))


def test_a_request_never_makes_the_model_open_a_file_outside_its_allowed_folder(served, tmp_path):
    """Without an image_root no path is read; with one, only files under it. Every refused
    path gets the same answer whether it exists, is a folder, or is unreadable, so a client
    cannot probe the host's files."""
    import pandas as pd
    from mlflow.exceptions import MlflowException

    from mule.serving.mlflow_model import MuleEmbeddings

    photo = _image_file(served["wd"], served["caption"]["image_id"]).read_bytes()
    root, outside = tmp_path / "allowed", tmp_path / "outside"
    root.mkdir(), outside.mkdir()
    (root / "photo.jpg").write_bytes(photo)
    (outside / "secret.jpg").write_bytes(photo)
    (outside / "locked.jpg").write_bytes(photo)
    (outside / "locked.jpg").chmod(0)
    (root / "link.jpg").symlink_to(outside / "secret.jpg")  # inside by name, outside in fact
    probes = [str(outside / "secret.jpg"), str(outside / "missing.jpg"), str(outside / "locked.jpg"), str(outside),
              "/etc/passwd", "/proc/self/environ", "../outside/secret.jpg", "../outside/missing.jpg", "link.jpg"]

    def answer(model, path: str) -> str:
        with pytest.raises(MlflowException) as refused:
            model.predict(None, pd.DataFrame({"image_path": [path]}))
        return str(refused.value).replace(repr(path), "PATH")

    model = MuleEmbeddings()
    model.embedder = served["embedder"]
    assert {answer(model, p) for p in [*probes, "photo.jpg"]} == {
        "row 1: image_path is read only by a model loaded in-process with an allowed folder (mlflow.pyfunc."
        "load_model(uri, model_config={'image_root': DIR})); send the image's bytes in `image` (base64 in JSON)"}
    model.image_root = root.resolve()
    assert {answer(model, p) for p in probes} == {"row 1: image_path PATH is not under the model's image_root"}
    inside = model.predict(None, pd.DataFrame({"image_path": ["photo.jpg", str(root / "photo.jpg")]}))
    sent = model.predict(None, pd.DataFrame({"image": [photo]}))
    assert np.allclose(np.stack(inside["embedding"].map(np.asarray)), np.asarray(sent["embedding"][0]), atol=1e-6)


@pytest.mark.slow
def test_mule_serve_never_imports_the_orchestrator(served):
    """mule serve as the command runs it, up to the moment its server would start: the
    champion, the gallery and the extractor are loaded, and Prefect was never imported."""
    script = ("import sys, uvicorn\n"
              "def run(app, **kw): print('routes', len(app.routes), 'prefect imported:', 'prefect' in sys.modules)\n"
              "uvicorn.run = run\n"
              "from mule.commands.main import main\n"
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
            assert np.allclose(vector, served["embedder"].encode_text(caption["text"])[0], atol=1e-5)
            status, answer = _post_json(f"http://127.0.0.1:{port}/invocations",
                                        {"dataframe_split": {"columns": ["text"], "data": [["xyzzy qwrtp"]]}})  # fmt: skip
            assert status == 400 and "row 1" in json.dumps(answer), answer
        finally:
            server.terminate()
            server.wait(timeout=30)


def test_the_search_api_answers_and_says_what_is_wrong_with_a_bad_request(served, tmp_path):
    api = client(served["app"])
    caption, gallery, embedder = served["caption"], served["gallery"], served["embedder"]
    found = api.get("/api/search", params={"q": caption["text"], "k": 3}).json()
    assert found["lang"] == "en" and found["language"].startswith("detected: en")
    expected = [r["image_id"] for r in gallery.top_images(embedder.encode_text(caption["text"], "en")[0], 3)]
    assert [r["image_id"] for r in found["results"]] == expected  # the exact ranking, whatever the model's quality
    first = found["results"][0]
    assert first["url"] == f"/images/{first['image_id']}"
    assert found["gallery"] == len(gallery.image_ids) == 88
    picture = api.get(first["url"])
    assert picture.status_code == 200 and picture.content == _image_file(served["wd"], first["image_id"]).read_bytes()
    image = _image_file(served["wd"], caption["image_id"]).read_bytes()
    sentences = api.post("/api/image", params={"k": 2}, content=image).json()["results"]
    assert list(sentences) == ["en", "de", "fr", "cs"] and all(len(rows) == 2 for rows in sentences.values())
    info = api.get("/api/info").json()
    assert info["languages"] == ["en", "de", "fr", "cs"] and info["images"] == 88 and info["index"] == "exact"

    def refused(response, status: int, words: str) -> None:
        assert response.status_code == status, response.text
        assert words in response.json()["error"], response.json()
        assert "Traceback" not in response.text

    refused(api.get("/api/search", params={"q": "   "}), 400, "the sentence is empty")
    refused(api.get("/api/search", params={"q": "ein Bild", "lang": "ja"}), 400, "does not read 'ja'")
    refused(api.get("/api/search", params={"q": "xyzzy qwrtp"}), 400, "none of the words")
    refused(api.get("/api/search", params={"q": "a dog", "k": 0}), 400, "k must be between 1 and 100")
    refused(api.get("/api/search", params={"q": "a dog", "k": "many"}), 400, "k: ")
    refused(api.get("/api/search", params={"q": "a " * 600}), 413, "at most 1,000")
    refused(api.post("/api/image", content=b"GIF89a not really"), 415, "not an image that can be read")
    refused(api.post("/api/image", content=b""), 400, "the request's body is empty")
    refused(api.post("/api/image", content=b"\xff" * (64 * 1024 + 1)), 413, "at most 65,536")
    # Only the catalog's images, by id: nothing in a request is a path.
    secret = tmp_path / "secret.jpg"
    secret.write_bytes(image)
    for attempt in ("../../../../etc/passwd", "..%2F..%2Fetc%2Fpasswd", str(secret), "%2Fetc%2Fpasswd",
                    f"..%2F{caption['image_id']}", "train-000000.jpg"):  # fmt: skip
        response = api.get(f"/images/{attempt}")
        assert response.status_code == 404, (attempt, response.status_code)
        assert response.content != image and b"root:" not in response.content


@pytest.mark.slow
def test_served_recall_at_10_is_the_evaluation_stage_s(served):
    """Every test caption asked through the API, as a client would, against the test split's
    gallery: the share whose image comes back in the ten is the evaluate stage's t2i R@10
    for the same model and split; every test image posted as an upload: its own sentences
    among the ten per language, the stage's i2t R@10."""
    from mule.serving import gallery as galleries
    from mule.serving.app import create_app

    table = served["results"]["evaluate"]["table"]
    test = galleries.load_gallery(served["searcher"], "test")
    api = client(create_app(served["embedder"], test, dataset="embedded"))
    files = {i: _image_file(served["wd"], i).read_bytes() for i in test.image_ids}
    answers = {i: api.post("/api/image", params={"k": 10}, content=b).json()["results"] for i, b in files.items()}
    checked = []
    for lang, captions in test.captions.items():
        if table[lang]["images"] != len(test.image_ids):
            continue  # the stage ranks only the images that have captions in the language
        hits = [image_id in [r["image_id"] for r in api.get("/api/search", params={"q": text, "lang": lang, "k": 10}).json()["results"]]
                for text, image_id in zip(captions.texts, captions.image_ids)]  # fmt: skip
        # the stage computes in float32; one query of the split moves the figure by >= 0.1
        assert 100 * np.mean(hits) == pytest.approx(table[lang]["t2i_r10"], abs=1e-4), lang
        own = [image_id in {r["image_id"] for r in answers[image_id][lang]} for image_id in test.image_ids]
        assert 100 * np.mean(own) == pytest.approx(table[lang]["i2t_r10"], abs=1e-4), lang
        checked.append(lang)
    assert {"en", "de"} <= set(checked), checked


def test_the_index_stage_s_index_serves_what_the_exact_scan_finds(served):
    """mule serve over the stored index (memory-mapped, no image vectors loaded): the same
    top ten as the exact scan for the drawn test captions, and /api/info says which."""
    from mule.serving import gallery as galleries
    from mule.serving.app import create_app

    stored, why = galleries.stored_index(served["searcher"])
    assert stored is not None, why
    indexed = galleries.load_gallery(served["searcher"], "all", stored)
    assert indexed.vectors.size == 0 and sorted(indexed.image_ids) == sorted(served["gallery"].image_ids)
    api = client(create_app(served["embedder"], indexed, dataset="embedded"))
    assert api.get("/api/info").json()["index"].startswith("hnsw-sq8")
    english = served["gallery"].captions["en"]
    rows = np.random.default_rng(SEED).choice(len(english.ids), size=20, replace=False)
    overlap = []
    for row in rows:
        exact = {r["image_id"] for r in served["gallery"].top_images(english.vectors[row], 10)}
        found = api.get("/api/search", params={"q": english.texts[row], "lang": "en", "k": 10}).json()["results"]
        overlap.append(len(exact & {r["image_id"] for r in found}) / 10)
    assert np.mean(overlap) >= 0.95, overlap


def test_mule_search_answers_what_mule_serve_answers(served, tmp_path):
    """One search path: `mule search` ranks a sentence's images and an image's sentences as
    `mule serve` does (the same gallery, the same scores), and past index.min_images it
    searches the index stage's index as mule serve does."""
    from mule.serving import gallery as galleries
    from mule.serving import retrieval

    caption, api = served["caption"], client(served["app"])
    searched = retrieval.search_text(served["searcher"], caption["text"], k=10)
    answered = api.get("/api/search", params={"q": caption["text"], "k": 10}).json()
    assert searched["searched"] == "exact scan"
    assert [(r["image_id"], r["split"]) for r in searched["results"]] == \
        [(r["image_id"], r["split"]) for r in answered["results"]]  # fmt: skip
    assert [r["score"] for r in searched["results"]] == pytest.approx([r["score"] for r in answered["results"]], abs=1e-6)
    photo = tmp_path / "photo.jpg"
    photo.write_bytes(_image_file(served["wd"], caption["image_id"]).read_bytes())
    by_image = retrieval.search_image(served["searcher"], photo, k=5)["results"]
    posted = api.post("/api/image", params={"k": 5}, content=photo.read_bytes()).json()["results"]
    assert set(by_image) == set(posted) and {"en", "de"} <= set(by_image)
    for lang in by_image:
        assert [r["caption_id"] for r in by_image[lang]] == [r["caption_id"] for r in posted[lang]], lang
    assert galleries.MIN_INDEXED_IMAGES > len(served["gallery"].image_ids)
    indexed = retrieval.search_text(served["searcher"], caption["text"], k=10, min_images=1)  # a large gallery
    assert indexed["searched"].startswith("hnsw-sq8"), indexed["searched"]
    assert len({r["image_id"] for r in indexed["results"]} & {r["image_id"] for r in searched["results"]}) >= 8


def test_the_search_breadth_is_given_to_mule_serve_not_read_from_the_model(served):
    """index.breadth is a serving option: `mule serve --set index.breadth=N` sets it on the
    stored index, whatever config the model was trained under; other options are refused."""
    from mule.commands.serve import serving_options
    from mule.data_catalog import ann
    from mule.mule_core.settings import ConfigError
    from mule.serving import gallery as galleries

    options = serving_options(["index.breadth=256", "index.min_images=10"])
    assert (options.breadth, options.min_images) == (256, 10)
    stored, _ = galleries.stored_index(served["searcher"], breadth=options.breadth)
    assert ann.breadth(stored[0]) == 256
    default, _ = galleries.stored_index(served["searcher"])
    assert ann.breadth(default[0]) == ann.default_breadth(default[0])
    with pytest.raises(ConfigError, match="train.epochs is not a serving option"):
        serving_options(["train.epochs=3"])


def test_the_server_answers_only_to_its_own_names(served):
    """DNS rebinding: a page elsewhere whose name now points at 127.0.0.1 sends its own
    name as Host; the server refuses it before any route runs."""
    from mule.serving.app import Limits, allowed_hosts_for, create_app

    for host in ("127.0.0.1:8000", "localhost:8000", "[::1]:8000", "LOCALHOST"):
        assert client(served["app"], host).get("/api/info").status_code == 200, host
    for host in ("attacker.example:8000", "127.0.0.1.attacker.example", "evil", "[::2]:8000"):
        refused = client(served["app"], host).get("/api/search", params={"q": "a dog"})
        assert refused.status_code == 421 and "does not answer to the host" in refused.json()["error"], host
    proxied = create_app(served["embedder"], served["gallery"],
                         limits=Limits(allowed_hosts=allowed_hosts_for("127.0.0.1", ("searcher.example.org",))))
    assert client(proxied, "searcher.example.org").get("/api/info").status_code == 200
    assert "searcher.example.org" not in allowed_hosts_for("127.0.0.1")


def test_images_go_out_as_what_their_bytes_are_and_never_sniffed(served, tmp_path):
    from mule.serving.app import create_app
    from mule.serving.gallery import Gallery

    api = client(served["app"])
    image_id = served["caption"]["image_id"]
    picture = api.get(f"/images/{image_id}")
    head = _image_file(served["wd"], image_id).read_bytes()[:8]
    assert picture.headers["content-type"] == ("image/png" if head.startswith(b"\x89PNG") else "image/jpeg")
    assert picture.headers["x-content-type-options"] == "nosniff"
    assert api.get("/api/info").headers["x-content-type-options"] == "nosniff"
    # a gallery file that has become a page (named .jpg) is not served as anything
    page = tmp_path / "photo.jpg"
    page.write_text("<html><script>alert(1)</script></html>")
    g = served["gallery"]
    swapped = Gallery(g.image_ids, g.splits, g.vectors, {image_id: page}, g.captions)
    assert client(create_app(served["embedder"], swapped)).get(f"/images/{image_id}").status_code == 404


def test_an_upload_over_the_pixel_budget_is_refused_from_its_header(served):
    import io

    from PIL import Image

    from tests.test_image_kinds import png_claiming_size

    api = client(served["app"])
    bomb = api.post("/api/image", content=png_claiming_size(9000, 9000))
    assert bomb.status_code == 413, bomb.text
    assert bomb.json()["error"] == "the upload: 9000x9000 pixels is more than 40,000,000: not decoded"
    buffer = io.BytesIO()
    Image.new("RGB", (1200, 900), "teal").save(buffer, "PNG")
    assert api.post("/api/image", content=buffer.getvalue()).status_code == 200


def _slow_embedder(served, began, release):
    """The served model whose image encoder calls `began()`, then waits for `release`."""

    class SlowEmbedder(type(served["embedder"])):
        def encode_image(self, images, max_pixels=0):
            began()
            release.wait(20)
            return super().encode_image(images, max_pixels)

    return SlowEmbedder(**{f: getattr(served["embedder"], f) for f in served["embedder"].__dataclass_fields__})


def test_cpu_work_runs_off_the_event_loop(served):
    """While one upload is being encoded (made slow here), the loop still answers."""
    import threading

    from mule.serving.app import create_app

    release, started = threading.Event(), threading.Event()
    slow = _slow_embedder(served, started.set, release)
    image = _image_file(served["wd"], served["caption"]["image_id"]).read_bytes()
    answers = []
    # one event loop for every request, as uvicorn has (a TestClient outside `with` makes one per request)
    with client(create_app(slow, served["gallery"], dataset="embedded")) as api:
        upload = threading.Thread(target=lambda: answers.append(api.post("/api/image", content=image)))
        upload.start()
        try:
            assert started.wait(20)
            t = time.perf_counter()
            assert api.get("/api/info").status_code == 200 and time.perf_counter() - t < 1.0  # not stuck behind it
        finally:
            release.set()
            upload.join(20)
    assert [a.status_code for a in answers] == [200]


def test_uploads_decode_on_threads_of_their_own_and_searches_keep_theirs(served):
    """Uploads that take their time (large images, made slow here) fill their own pool,
    one thread fewer than --threads; a sentence search is answered meanwhile, never queued
    behind them (they shared one pool of --threads, and a burst of 16-bit PNGs put the
    searches' p99 past a second)."""
    import threading

    from mule.serving.app import Limits, create_app

    release, busy = threading.Event(), threading.Semaphore(0)
    slow = _slow_embedder(served, busy.release, release)
    image = _image_file(served["wd"], served["caption"]["image_id"]).read_bytes()
    query = urllib.parse.quote(served["caption"]["text"])
    answers = []
    with client(create_app(slow, served["gallery"], "embedded", Limits(cpu_threads=2))) as api:
        uploads = [threading.Thread(target=lambda: answers.append(api.post("/api/image", content=image)))
                   for _ in range(3)]  # fmt: skip
        for upload in uploads:
            upload.start()
        try:
            assert busy.acquire(timeout=20)  # one decodes: two threads, one fewer for uploads
            assert not busy.acquire(timeout=0.5)  # the others wait for it, on their own pool
            for _ in range(3):  # the search pool's two threads are the searches' own
                t = time.perf_counter()
                assert api.get(f"/api/search?q={query}&k=5").status_code == 200
                assert time.perf_counter() - t < 1.0
        finally:
            release.set()
            for upload in uploads:
                upload.join(20)
    assert [a.status_code for a in answers] == [200] * 3


def test_past_max_in_flight_the_next_request_gets_503_with_retry_after():
    """The admission bound, on the Guard alone: two requests held in flight, the third is
    turned away at once; when one finishes, the next is admitted again."""
    import asyncio

    from mule.serving.app import Guard

    async def scenario():
        gate = asyncio.Event()

        async def held(scope, receive, send):
            await gate.wait()
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"ok"})

        guard = Guard(held, allowed_hosts=(), max_in_flight=2)

        async def ask():
            sent = []

            async def send(message):
                sent.append(message)

            async def receive():
                return {"type": "http.request", "body": b"", "more_body": False}

            await guard({"type": "http", "headers": [(b"host", b"127.0.0.1")]}, receive, send)
            return sent[0]["status"], dict(sent[0]["headers"])

        first, second = asyncio.create_task(ask()), asyncio.create_task(ask())
        await asyncio.sleep(0.05)
        status, headers = await asyncio.wait_for(ask(), 5)
        assert status == 503 and headers[b"retry-after"] == b"1" and headers[b"x-content-type-options"] == b"nosniff"
        gate.set()
        assert [(await first)[0], (await second)[0]] == [200, 200]
        status, headers = await asyncio.wait_for(ask(), 5)
        assert status == 200 and headers[b"x-content-type-options"] == b"nosniff"

    asyncio.run(scenario())


@pytest.mark.slow
def test_the_search_page_in_a_real_browser(served, tmp_path):
    """`mule serve` as a user starts it; headless Chromium types the drawn test caption and sees the ten images the model
    ranks first, in order, then gives it an image and gets sentences per language."""
    wd, caption = served["wd"], served["caption"]
    ranked = [r["image_id"] for r in served["gallery"].top_images(served["embedder"].encode_text(caption["text"], "en")[0], 10)]
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "mule.commands", "serve", "--workdir", str(wd.root), "--port",
                               str(port)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    try:
        _wait_for(f"http://127.0.0.1:{port}/api/info", server, 120)
        with browser.page() as page:
            page.goto(f"http://127.0.0.1:{port}/")
            page.wait_for_function("document.getElementById('info').textContent.includes('88 images')")
            page.fill("#q", caption["text"])
            page.press("#q", "Enter")
            page.wait_for_selector(f"figure[data-image-id='{ranked[0]}']", timeout=20_000)
            assert "detected: en" in page.text_content("#status")
            shown_ids = page.eval_on_selector_all("#results figure", "fs => fs.map(f => f.dataset.imageId)")
            assert shown_ids == ranked, (shown_ids, ranked)
            shown = page.locator(f"figure[data-image-id='{ranked[0]}'] img").element_handle()
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


def _png16(side: int) -> bytes:
    """A side x side 16-bit grey PNG: a gradient, a few hundred KB for tens of megapixels."""
    import io

    from PIL import Image

    row = (np.arange(side, dtype=np.uint32) * 65535 // max(side - 1, 1)).astype(np.uint16)
    buffer = io.BytesIO()
    Image.fromarray(np.broadcast_to(row, (side, side)).copy()).save(buffer, "PNG")
    return buffer.getvalue()


def _slow_upload(port: int, announced: int) -> socket.socket:
    """A client that announces an upload of `announced` bytes and sends its first byte only."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.sendall(f"POST /api/image HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: image/png\r\n"
                 f"Content-Length: {announced}\r\n\r\n".encode() + b"\x89")  # fmt: skip
    return sock


def _slow_headers(port: int) -> socket.socket:
    """A client that starts a request and never ends its headers."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.sendall(f"GET /api/info HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nX-Slow: ".encode())
    return sock


def _status(sock: socket.socket) -> int:
    head = sock.recv(4096).decode("latin-1")
    return int(head.split()[1]) if head.startswith("HTTP/") else 0


@pytest.mark.slow
def test_slow_clients_and_16_bit_uploads_never_lock_others_out(served, tmp_path):
    """`mule serve` as a user runs it, against clients it does not know: uploads that
    announce a megabyte and send one byte, requests whose headers never end, more of them
    than it admits uploads; meanwhile the page, a search and /api/info are answered within
    a second. The slow ones get 408 when their deadline passes. Then four 6000 x 6000
    16-bit PNGs at once (200 KB each, 36 MP: under the pixel budget) are answered, and the
    server grows by a few hundred MB, not gigabytes. Its log has no traceback."""
    import psutil

    wd, caption = served["wd"], served["caption"]
    port = free_port()
    log = (tmp_path / "serve.log").open("w")
    server = subprocess.Popen([sys.executable, "-m", "mule.commands", "serve", "--workdir", str(wd.root), "--port",
                               str(port), "--max-uploads", "4", "--body-timeout", "4", "--header-timeout", "4",
                               "--reload", "0"], stdout=log, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    slow: list[socket.socket] = []
    try:
        _wait_for(f"{base}/api/info", server, 120)
        slow = [_slow_upload(port, 2**20) for _ in range(12)] + [_slow_headers(port) for _ in range(6)]
        time.sleep(0.5)
        for path in ("/", f"/api/search?q={urllib.parse.quote(caption['text'])}&k=5", "/api/info"):
            started = time.monotonic()
            with urllib.request.urlopen(base + path, timeout=5) as answer:
                assert answer.status == 200, path
            assert time.monotonic() - started < 1.0, path
        # the upload slots are taken: another upload is turned away at once, never queued
        request = urllib.request.Request(f"{base}/api/image", data=b"x", method="POST")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=5)
        assert refused.value.code == 503
        statuses = [_status(sock) for sock in slow]  # each deadline passes (4 s): 408, or closed
        assert statuses[:4] == [408] * 4, statuses  # the admitted uploads: their body was too slow
        assert all(s in (408, 503) for s in statuses[4:12]), statuses  # the others: turned away
        assert statuses[12:] == [408] * 6, statuses  # headers that never ended

        # The image extractor is loaded at the first upload (from the ONNX cache: a fraction of
        # a second): loaded first, so that what is measured is the four uploads alone.
        warm = urllib.request.Request(f"{base}/api/image?k=1", data=_png16(64), method="POST")
        with urllib.request.urlopen(warm, timeout=120) as answer:
            assert answer.status == 200
        process = psutil.Process(server.pid)
        before = process.memory_info().rss
        peak = [before]
        done = threading.Event()

        def watch() -> None:
            while not done.is_set():
                peak.append(process.memory_info().rss)
                time.sleep(0.02)

        watcher = threading.Thread(target=watch)
        watcher.start()
        png = _png16(6000)
        assert len(png) < 2**20

        def post(_) -> int:
            req = urllib.request.Request(f"{base}/api/image?k=3", data=png, method="POST")
            with urllib.request.urlopen(req, timeout=120) as answer:
                return answer.status

        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(4) as pool:
            assert list(pool.map(post, range(4))) == [200] * 4
        done.set()
        watcher.join()
        grown = (max(peak) - before) / 2**20
        # measured: 524-530 MiB (2026-11-26, the extractor loaded before; 670-705 while it loaded)
        assert grown < 700, f"the server grew by {grown:.0f} MiB for four 36 MP 16-bit uploads"
    finally:
        for sock in slow:
            sock.close()
        server.terminate()
        server.wait(timeout=30)
        log.close()
    output = (tmp_path / "serve.log").read_text()
    assert "Traceback" not in output, output[-3000:]


@pytest.mark.slow
def test_mule_serve_serves_a_new_champion_and_new_gallery_without_a_restart(served, tmp_path):
    """The reloader (every --reload seconds in mule serve) sees a new champion, or a gallery
    stage that ran again, loads it beside what is served and swaps it in; a request in
    flight keeps what it began with; nothing is written to the workdir by serving."""
    import shutil

    from mlflow.tracking import MlflowClient

    from mule.experiments.relocation import adopt
    from mule.serving import live as serving
    from mule.serving.app import Live
    from mule.storage.workdir import Workdir

    shutil.copytree(served["wd"].root, tmp_path / "work")
    wd = Workdir.at(tmp_path / "work")
    adopt(wd)  # as the run that made it there would have
    request = serving.Request(wd, "embedded", index="off")
    first, source, _ = serving.load(request)
    current = Live(first)
    reloader = serving.Reloader(request, current, source, period=3600)
    before = {p: p.stat().st_mtime_ns for p in wd.root.rglob("*") if p.is_file()}
    assert not reloader.check() and current.current is first  # nothing changed: nothing loaded

    # a rebuild registered a new champion (another train run's model)
    client = MlflowClient(wd.mlflow_uri)
    champion = client.get_model_version_by_alias("mule-embedded", "champion")
    run = client.create_run(client.get_run(champion.run_id).info.experiment_id).info.run_id
    client.log_artifact(run, str(wd.model_path("embedded")))
    version = client.create_model_version("mule-embedded", f"runs:/{run}/model.pt", run_id=run)
    client.set_registered_model_alias("mule-embedded", "champion", version.version)
    assert reloader.check() and current.current is not first
    assert f"v{version.version} (champion)" in current.current.note
    second = current.current

    # a gallery stage ran again (its record is new): the gallery is loaded anew
    record = next((wd.state_dir / "stages" / "embedded").glob("features.json"))
    record.write_text(record.read_text())
    assert reloader.check() and current.current is not second
    assert sorted(current.current.gallery.image_ids) == sorted(first.gallery.image_ids)
    changed = [p for p, t in before.items() if p.exists() and p.stat().st_mtime_ns != t and p.name != "features.json"]
    assert not [p for p in changed if "mlflow.db" not in p.name and "mlartifacts" not in str(p)], changed


def test_the_readme_s_front_door_runs_as_written(served, tmp_path, monkeypatch):
    """README.md's "Use a trained model in Python" block, run as a user would beside a demo
    workdir: its vectors are the ones mule serve embeds with, and a workdir, its model file
    and the registered model's URI load the same model."""
    import mlflow
    from PIL import Image

    from mule import api

    readme = (Path(__file__).parents[1] / "README.md").read_text()
    block = re.search(r"<!-- front door[^>]*-->\n```python\n(.*?)```", readme, re.S)
    assert block, "README.md lost its front-door block"
    assert len(block.group(1).strip().splitlines()) <= 10
    wd = served["wd"]
    (tmp_path / "mule-work").symlink_to(wd.root)  # the demo's workdir, its images where `mule demo` puts them
    monkeypatch.chdir(tmp_path)
    names: dict = {}
    exec(compile(block.group(1), "README.md", "exec"), names)
    model, texts, images = names["model"], names["texts"], names["images"]
    dim = served["embedder"].meta["cfg"].model.joint_dim  # 128 by default, 512 in the paper preset
    assert texts.shape == (2, dim) and images.shape == (2, dim) and names["best"].shape == (2,)
    embedder = served["embedder"]
    assert np.allclose(texts[1], embedder.encode_text("ein blaues Quadrat")[0], atol=1e-6)
    photo = wd.root / "raw" / "embedded" / "images" / "test_2016-000001.jpg"
    assert np.allclose(images[0], embedder.encode_image(photo)[0], atol=1e-6)
    # a model file, and the registered model in MLflow, are the same model
    previous = mlflow.get_tracking_uri()
    try:
        loaded = [api.load(served["searcher"].model_file), api.load(MODEL_URI, tracking_uri=wd.mlflow_uri)]
    finally:
        mlflow.set_tracking_uri(previous)
    for other in loaded:
        assert np.allclose(other.encode_text(["a red circle on the left", "ein blaues Quadrat"]), texts, atol=1e-6)
    # preprocess: a PIL image's crops, stacked, embed as its file does
    with Image.open(wd.root / "raw" / "embedded" / "images" / "test_2016-000002.jpg") as image:
        crops = model.preprocess(image)
    assert np.allclose(model.encode_image(crops.unsqueeze(0)), images[1:], atol=1e-5)
    with pytest.raises(FileNotFoundError, match="no such workdir or model file"):
        api.load(tmp_path / "nowhere")


def readme_command_lines() -> list[str]:
    """Every `mule ...` line of README.md's shell blocks, its comment cut."""
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    lines = []
    for language, block in re.findall(r"^```(\w*)\n(.*?)^```", readme, re.S | re.M):
        if language not in ("", "bash"):
            continue
        for line in block.splitlines():
            command = line.split("  #")[0].strip()
            for part in command.split("&&"):
                part = part.strip().removeprefix(".venv/bin/")
                if part.startswith("mule "):
                    lines.append(part)
    return lines


def test_every_mule_line_of_the_readme_is_a_command_mule_takes_and_the_quick_ones_run(served, tmp_path,
                                                                                      monkeypatch, capsys):  # fmt: skip
    """Each `mule ...` line the README shows parses as written (its options exist, its
    values are valid); those that only read a trained workdir run as written beside the
    demo's (`mule-work`) and exit 0."""
    import shlex

    from mule.commands.main import build_parser, main

    lines = readme_command_lines()
    assert len(lines) >= 12, lines
    for line in lines:
        words = [w for w in shlex.split(line)[1:] if w != "..."]
        if "|" in words or "ID" in words or "N" in words:  # alternatives and placeholders: `--run ID | --version 3`
            continue
        try:
            build_parser().parse_args(words)
        except SystemExit as stop:
            raise AssertionError(f"README: `{line}` is not a command mule takes") from stop
    (tmp_path / "mule-work").symlink_to(served["wd"].root)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MULE_HOME", raising=False)
    ran = 0
    for line in lines:
        words = shlex.split(line)[1:]
        if words[:1] in (["search"], ["catalog"], ["config"]) and "--image" not in words and "--run" not in words:
            assert main(words) == 0, line
            ran += 1
    assert ran >= 4
    capsys.readouterr()


@pytest.mark.slow
def test_a_client_that_stops_reading_an_answer_is_dropped_and_gives_its_slot_back():
    """A download (a large gallery image) whose client reads nothing once the socket
    buffers are full held a general slot for as long as the client liked: with one slot,
    /api/info was a 503 for good. The send deadline drops that client after
    --send-timeout seconds of a full send buffer, and the next request is answered."""
    import asyncio

    import uvicorn

    from mule.serving.app import Guard, deadline_protocol

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        if scope["path"] == "/big":  # 64 MB, far more than loopback's socket buffers hold
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", str(2**26).encode())]})
            chunk = bytes(2**20)
            for _ in range(64):
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
            return
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})

    port = free_port()
    config = uvicorn.Config(Guard(app, allowed_hosts=(), max_in_flight=1), port=port, log_level="warning",
                            http=deadline_protocol(10.0, send_timeout=1.0))  # fmt: skip
    server = uvicorn.Server(config)
    thread = threading.Thread(target=lambda: asyncio.run(server.serve()), daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        stalled = socket.create_connection(("127.0.0.1", port), timeout=30)
        stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        stalled.sendall(f"GET /big HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())  # and never reads
        time.sleep(0.3)

        def status() -> int:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/small", timeout=5) as answer:
                    return answer.status
            except urllib.error.HTTPError as error:
                return error.code

        assert status() == 503  # the one slot is the stalled download's
        started = time.monotonic()
        while status() != 200:
            assert time.monotonic() - started < 10, "the stalled client still holds its slot"
            time.sleep(0.2)
        stalled.close()
    finally:
        server.should_exit = True
        thread.join(10)


@pytest.mark.slow
def test_a_model_file_opens_with_the_model_library_and_its_file_format_alone(served):
    """api.load of a model file reads it with mule_core and data_catalog's model format:
    no registry, MLflow, Prefect or pipeline is imported (a workdir or an MLflow URI goes
    through the registry, and only then)."""
    code = ("import sys, json; from mule import api; e = api.load(sys.argv[1]); e.encode_text('a red circle'); "
            "print(json.dumps(sorted({m.split('.')[0] if not m.startswith('mule.') else '.'.join(m.split('.')[:2]) "
            "for m in sys.modules if m.startswith(('mule.', 'mlflow', 'prefect'))})))")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code, str(served["searcher"].model_file)], capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    rooms = set(json.loads(done.stdout.strip().splitlines()[-1]))
    assert not rooms & {"mlflow", "prefect", "mule.experiments", "mule.pipeline", "mule.flows", "mule.serving"}, rooms
    assert {"mule.mule_core", "mule.data_catalog", "mule.api"} <= rooms, rooms


@pytest.fixture(scope="module")
def exported(served, tmp_path_factory):
    """The champion as `mule export` writes it."""
    from mule.commands.main import main

    out = tmp_path_factory.mktemp("exported") / "mule-embedded"
    assert main(["export", "--workdir", str(served["wd"].root), "--out", str(out)]) == 0
    return out


@pytest.mark.slow
def test_an_exported_folder_loads_offline_with_no_workdir_and_embeds_as_mule_serve(served, exported, tmp_path):
    """`mule export` writes the champion as a folder (safetensors, vocabularies as text, the
    preprocessing, the extractor's weights, a model card naming the split and protocol);
    in a fresh process, with no workdir, no MLflow and the network refused, mule.api.load
    opens it and embeds a caption and an image as mule serve does."""
    wd, caption, out = served["wd"], served["caption"], exported
    files = {str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()}
    assert {"model.safetensors", "mule_model.json", "README.md", "config.json", "visual/preprocess_cfg.json",
            "textual/model.onnx", "textual/model.int8.onnx", "textual/tower.json", "visual/model.onnx",
            "visual/model.int8.onnx"} <= files, files  # fmt: skip
    assert json.loads((out / "config.json").read_text())["embed_dim"] == embedder_dim(served)
    assert sorted(p.name for p in (out / "vocab").iterdir()) == ["cs.txt", "de.txt", "en.txt", "fr.txt"]
    card = (out / "README.md").read_text()
    assert "Split `test_2016`" in card and "| en chance |" in card and "terms: generated by mule" in card
    assert "textual/model.int8.onnx" in card
    from huggingface_hub import ModelCard  # the Hub's own reader of a model card's metadata

    metadata = ModelCard.load(out / "README.md").data
    assert metadata.language == ["en", "de", "fr", "cs"] and metadata.library_name == "mule" and "onnx" in metadata.tags
    image = tmp_path / "photo.jpg"
    image.write_bytes(_image_file(wd, caption["image_id"]).read_bytes())
    script = f"""
import json, socket, sys
def refuse(*args, **kwargs):
    raise OSError("no network here")
socket.socket.connect = refuse
socket.create_connection = refuse
from mule import api
model = api.load({str(out)!r})
vectors = [model.encode_text({caption["text"]!r})[0].tolist(), model.encode_image({str(image)!r})[0].tolist()]
print(json.dumps({{"vectors": vectors, "modules": sorted(m for m in sys.modules if m.startswith(("mlflow", "prefect")))}}))
"""
    moved = tmp_path / "elsewhere"  # no workdir: the folder is all it has
    moved.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("MULE_HOME", "MLFLOW_TRACKING_URI", "PREFECT_API_URL")}
    done = subprocess.run([sys.executable, "-c", script], cwd=moved, env=env, capture_output=True, text=True,
                          timeout=180)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    assert answer["modules"] == [] and not (moved / "mule-work").exists()
    embedder = served["embedder"]
    assert np.allclose(answer["vectors"][0], embedder.encode_text(caption["text"])[0], atol=1e-6)
    assert np.allclose(answer["vectors"][1], embedder.encode_image(image)[0], atol=1e-5)
    import shutil

    from mule import api
    from mule.mule_core.errors import MissingInputError

    broken = tmp_path / "broken"
    shutil.copytree(out, broken)
    (broken / "vocab" / "fr.txt").unlink()
    with pytest.raises(MissingInputError, match=r"vocab/fr\.txt: missing"):
        api.load(broken)


def embedder_dim(served) -> int:
    return served["embedder"].meta["cfg"].model.joint_dim


def test_the_onnx_towers_embed_as_pytorch_does_for_every_language(served, exported, tmp_path, capsys):
    """engine="onnxruntime" runs the folder's ONNX towers: every test caption of every
    language (words outside the vocabulary, composed from n-grams, among them) and test
    images get PyTorch's vectors within 1e-5; the int8 text tower's are within cosine 0.99
    of them. A store tells the int8 vectors apart. The engine needs an exported folder; int8
    needs the engine."""
    from mule import api

    embedder, gallery = served["embedder"], served["gallery"]
    onnx, int8 = api.load(exported, engine="onnxruntime"), api.load(exported, engine="onnxruntime", int8=True)
    split = dict(zip(gallery.image_ids, gallery.splits))
    composed = 0
    for lang in embedder.languages:
        captions = gallery.captions[lang]
        texts = [t for t, i in zip(captions.texts, captions.image_ids) if split[i].startswith("test")]
        assert len(texts) >= 20, lang
        expected = embedder.encode_text(texts, lang, details=True)
        composed += sum(bool(v.composed_words) for v in expected)
        expected = np.stack([v.vector for v in expected])
        assert np.abs(onnx.encode_text(texts, lang) - expected).max() < 1e-5, lang
        assert (int8.encode_text(texts, lang) * expected).sum(1).min() > 0.99, lang
    assert composed >= 5, "the test captions should hold words composed from their n-grams"
    images = [_image_file(served["wd"], i) for i, s in zip(gallery.image_ids, gallery.splits) if s.startswith("test")][:12]
    assert np.abs(onnx.encode_image(images) - embedder.encode_image(images)).max() < 1e-5
    assert np.allclose(np.linalg.norm(int8.encode_image(images[:2]), axis=1), 1, atol=1e-4)
    from mule.serving.batch_embed import model_identity

    # a store of float32 ONNX vectors is PyTorch's; int8 vectors are others, kept apart
    assert model_identity(onnx) == model_identity(embedder) != model_identity(int8)
    with pytest.raises(ValueError, match="folder `mule export` wrote"):
        api.load(served["searcher"].model_file, engine="onnxruntime")
    with pytest.raises(ValueError, match="needs engine='onnxruntime'"):
        api.load(exported, int8=True)
    from mule.commands.main import main

    # on the command line, a model file given to the ONNX engine is a one-line error, not a traceback
    assert main(["embed", "--model", str(served["searcher"].model_file), "--engine", "onnxruntime",
                 "--images", str(tmp_path), "--out", str(tmp_path / "vectors")]) == 2  # fmt: skip
    said = capsys.readouterr().err.strip().splitlines()
    assert said[-1].startswith("mule: error:") and "folder `mule export` wrote" in said[-1]
    assert "Traceback" not in "\n".join(said)


def test_the_image_tower_runs_without_mule_as_the_docs_say(served, exported, tmp_path):
    """docs/take-away.md's image-tower block (ONNX Runtime, PIL and numpy, no mule code),
    run as written on a test image of the catalog, gives mule's vector within 1e-5."""
    block = re.search(r"The image tower needs nothing of mule's.*?```python\n(.*?)```", DOCS_TAKE_AWAY.read_text(), re.S)
    image = tmp_path / "beach.jpg"
    image.write_bytes(_image_file(served["wd"], served["caption"]["image_id"]).read_bytes())
    code = block.group(1).replace('"mule-embedded"', repr(str(exported))).replace('"beach.jpg"', repr(str(image)))
    scope: dict = {}
    exec(compile(code, "docs/take-away.md", "exec"), scope)  # noqa: S102 - the docs' own snippet
    assert np.abs(scope["vector"] - served["embedder"].encode_image(image)[0]).max() < 1e-5


def test_mule_embed_writes_a_resumable_store_that_names_its_model(served, tmp_path, capsys):
    """`mule embed`: images (a bad file rejected with its reason) and sentences (a row no
    word of which the model knows, rejected) into Parquet parts whose vectors are mule
    serve's; a rerun embeds nothing twice and a stopped one resumes; another model's
    store is refused, not mixed."""
    import pyarrow.parquet as pq

    from mule.commands.main import main

    wd, embedder = served["wd"], served["embedder"]
    images = tmp_path / "photos"
    (images / "sub").mkdir(parents=True)
    gallery_ids = served["gallery"].image_ids[:3]
    for image_id in gallery_ids:
        (images / f"{image_id}.jpg").write_bytes(_image_file(wd, image_id).read_bytes())
    (images / "sub" / "broken.jpg").write_bytes(b"not an image")
    out = tmp_path / "vectors"

    def embed(*args: str) -> int:
        return main(["embed", "--workdir", str(wd.root), "--out", str(out), *args])

    assert embed("--images", str(images)) == 0
    stored = pq.read_table(out / "part-00000.parquet").to_pylist()
    assert [r["id"] for r in stored] == sorted(f"{i}.jpg" for i in gallery_ids)
    for row in stored:
        assert np.allclose(row["vector"], embedder.encode_image(images / row["id"])[0], atol=1e-6)
    (reject,) = pq.read_table(out / "rejects-00000.parquet").to_pylist()
    assert reject["id"] == "sub/broken.jpg" and "not an image" in reject["reason"]
    assert embed("--images", str(images)) == 0 and "0 embedded, 0 rejected" in capsys.readouterr().out
    (out / "part-00000.parquet").unlink()  # a run stopped before its part was written: its images again, once
    assert embed("--images", str(images)) == 0
    ids = [i for p in sorted(out.glob("part-*.parquet")) for i in pq.read_table(p).column("id").to_pylist()]
    assert sorted(ids) == sorted(f"{i}.jpg" for i in gallery_ids)

    marker = json.loads((out / "model.json").read_text())
    (out / "model.json").write_text(json.dumps(marker | {"identity": "another-model"}))
    assert embed("--images", str(images)) == 2
    assert "would mix two spaces" in capsys.readouterr().err

    caption = served["caption"]
    table = tmp_path / "sentences.csv"
    table.write_text(f'id,text,lang\nc1,"{caption["text"]}",\nc2,ein blaues Quadrat,de\nc3,qqqq zzzz,\n'
                     "c4,ein roter Kreis,German\nc5,a red circle,EN\nc6,a blue square,en-GB\n")  # as ingest reads them
    out = tmp_path / "sentence-vectors"
    assert embed("--sentences", str(table)) == 0
    rows = pq.read_table(out / "part-00000.parquet").to_pylist()
    assert [(r["id"], r["lang"]) for r in rows] == [("c1", "en"), ("c2", "de"), ("c4", "de"), ("c5", "en"), ("c6", "en")]
    assert np.allclose(rows[0]["vector"], embedder.encode_text(caption["text"])[0], atol=1e-6)
    assert pq.read_table(out / "rejects-00000.parquet").column("id").to_pylist() == ["c3"]


def test_mule_embed_s_summary_is_what_its_store_holds(served, tmp_path, capsys, caplog):
    """70 corrupt files (two batches of rejects and no vectors): the summary says 70 rejected
    and the store holds 70 (their files used to write over each other: 6 held, 64 redone
    by the rerun). A 49.9-megapixel camera photo is embedded, as ingest would take it
    (mule serve's upload budget of 40 MP refused it for good); --max-pixels below it rejects
    it saying what raises the limit. Sentences without an id column are named by their
    content: a row inserted at the top changes no stored vector's id, and a repeated row
    is embedded once and said once."""
    import pyarrow.parquet as pq
    from PIL import Image

    from mule.commands.main import main
    from mule.serving.batch_embed import content_id

    wd, embedder = served["wd"], served["embedder"]

    def embed(out: Path, *args: str) -> str:
        assert main(["embed", "--workdir", str(wd.root), "--out", str(out), *args]) == 0
        return capsys.readouterr().out

    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    for n in range(70):
        (corrupt / f"scan-{n:02d}.jpg").write_bytes(b"\xff\xd8 cut short %d" % n)
    out = tmp_path / "corrupt-vectors"
    assert "0 embedded, 70 rejected" in embed(out, "--images", str(corrupt))
    held = [i for f in sorted(out.glob("rejects-*.parquet")) for i in pq.read_table(f).column("id").to_pylist()]
    assert sorted(held) == sorted(f"scan-{n:02d}.jpg" for n in range(70))
    again = embed(out, "--images", str(corrupt))
    assert "0 embedded, 0 rejected" in again and "70 already" in again

    camera = tmp_path / "camera"
    camera.mkdir()
    Image.new("RGB", (8660, 5760), (90, 140, 200)).save(camera / "IMG_0001.jpg", quality=70)  # 49.9 MP
    assert "1 embedded, 0 rejected" in embed(tmp_path / "camera-vectors", "--images", str(camera))
    (stored,) = pq.read_table(tmp_path / "camera-vectors" / "part-00000.parquet").to_pylist()
    budget = 8660 * 5760
    assert np.allclose(stored["vector"], embedder.encode_image(camera / "IMG_0001.jpg", max_pixels=budget)[0], atol=1e-6)
    assert "0 embedded, 1 rejected" in embed(tmp_path / "small-budget", "--images", str(camera), "--max-pixels", "10000000")
    (reject,) = pq.read_table(tmp_path / "small-budget" / "rejects-00000.parquet").to_pylist()
    assert "8660x5760 pixels is more than 10,000,000" in reject["reason"] and "--max-pixels raises the limit" in reject["reason"]
    assert main(["embed", "--workdir", str(wd.root), "--out", str(tmp_path / "x"), "--images", str(camera),
                 "--max-pixels", "999999999"]) == 2  # fmt: skip
    assert "--max-pixels must be between 1 and 178,956,970" in capsys.readouterr().err

    caption = served["caption"]["text"]
    table = tmp_path / "sentences.csv"
    table.write_text(f'text,lang\n"{caption}",en\nein blaues Quadrat,de\n', encoding="utf-8")
    out = tmp_path / "sentence-vectors"
    embed(out, "--sentences", str(table))
    table.write_text(f'text,lang\nein roter Kreis,de\n"{caption}",en\nein blaues Quadrat,de\nein blaues Quadrat,de\n',
                     encoding="utf-8")  # fmt: skip
    with caplog.at_level("WARNING", logger="mule.embed"):
        said = embed(out, "--sentences", str(table))
    assert "1 embedded, 0 rejected" in said and "2 already" in said and "1 repeated rows left out" in said
    warned = [r.getMessage() for r in caplog.records if "repeat" in r.getMessage()]
    assert warned == ["1 row repeat the same sentence (language and text) as an earlier row, embedded once (the "
                      "first): row 4 is row 3's sentence"]  # fmt: skip
    rows = {r["id"]: r for f in sorted(out.glob("part-*.parquet")) for r in pq.read_table(f).to_pylist()}
    expected = {content_id(caption, "en"): (caption, "en"), content_id("ein blaues Quadrat", "de"): ("ein blaues Quadrat", "de"),
                content_id("ein roter Kreis", "de"): ("ein roter Kreis", "de")}  # fmt: skip
    assert set(rows) == set(expected)
    for item, (text, lang) in expected.items():  # every id holds its own sentence's vector
        assert np.allclose(rows[item]["vector"], embedder.encode_text(text, lang)[0], atol=1e-6)

    given = tmp_path / "given.csv"
    given.write_text("id,text\n7,a red circle\n8,ein blaues Quadrat\n7,a blue square\n", encoding="utf-8")
    with caplog.at_level("WARNING", logger="mule.embed"):
        said = embed(tmp_path / "given-vectors", "--sentences", str(given))
    assert "2 embedded" in said and "1 repeated rows left out" in said
    assert any("row 3 has row 1's id '7'" in r.getMessage() for r in caplog.records)


@pytest.mark.slow
def test_a_search_over_mule_embed_s_vectors_finds_what_mule_search_finds(served, tmp_path, capsys):
    """The test split's image files through `mule embed` into each store (Parquet parts, a
    LanceDB table, a local Qdrant collection), then the top 10 for a caption by each store's
    own search: the images `mule search` ranks first over the catalog's features, in the
    same order. A rerun adds nothing; another model's store is refused."""
    import lancedb
    import pyarrow as pa
    import pyarrow.parquet as pq
    from qdrant_client import QdrantClient

    from mule.commands.main import main
    from mule.serving import retrieval
    from mule.serving.vector_stores import Maker, OtherModelError, open_store

    wd, caption = served["wd"], served["caption"]
    searcher = served["searcher"]
    test_ids = searcher.split("test", with_features=True).image_ids
    photos = tmp_path / "test-photos"
    photos.mkdir()
    for image_id in test_ids:
        (photos / f"{image_id}.jpg").write_bytes(_image_file(wd, image_id).read_bytes())
    query = served["embedder"].encode_text(caption["text"])[0]
    searched = [r["image_id"] for r in retrieval.search_text(searcher, caption["text"], k=10, split="test")["results"]]

    def embed(store: str) -> Path:
        out = tmp_path / f"test-vectors-{store}"
        assert main(["embed", "--workdir", str(wd.root), "--images", str(photos), "--out", str(out), "--store", store]) == 0
        assert f"{len(test_ids)} embedded" in capsys.readouterr().out
        assert main(["embed", "--workdir", str(wd.root), "--images", str(photos), "--out", str(out), "--store", store]) == 0
        assert "0 embedded, 0 rejected" in capsys.readouterr().out
        other = Maker("another-model", "another", "images", len(query))
        with pytest.raises(OtherModelError, match="would mix two spaces"):
            open_store(store, out, other).close()
        return out

    out = embed("parquet")
    table = pa.concat_tables(pq.read_table(p) for p in sorted(out.glob("part-*.parquet")))
    vectors = np.stack(table.column("vector").to_numpy(zero_copy_only=False))
    stored = [table.column("id")[i].as_py() for i in np.argsort(-(vectors @ query))[:10]]
    assert [i.removesuffix(".jpg") for i in stored] == searched

    def embed_again(out: Path, store: str) -> None:  # after a row was lost (a stopped run): that one, once
        assert main(["embed", "--workdir", str(wd.root), "--images", str(photos), "--out", str(out), "--store", store]) == 0
        assert "1 embedded, 0 rejected" in capsys.readouterr().out

    out = embed("lancedb")
    lancedb.connect(out).open_table("images").delete(f"id = '{stored[0]}'")
    embed_again(out, "lancedb")
    images = lancedb.connect(out).open_table("images")
    assert sorted(images.to_arrow().column("id").to_pylist()) == sorted(f"{i}.jpg" for i in test_ids)
    found = images.search(query).metric("dot").limit(10).to_list()
    assert [r["id"].removesuffix(".jpg") for r in found] == searched

    from mule.serving.vector_stores import QdrantStore

    out = embed("qdrant")
    client = QdrantClient(path=str(out))
    client.delete("images", points_selector=[QdrantStore.point_id(stored[0])])
    client.close()
    embed_again(out, "qdrant")
    client = QdrantClient(path=str(out))
    try:
        assert client.count("images").count == len(test_ids)
        found = client.query_points("images", query=query.tolist(), limit=10).points
        assert [p.payload["id"].removesuffix(".jpg") for p in found] == searched
    finally:
        client.close()


@contextmanager
def read_only(folder: Path):
    """`folder` as a read-only mount at another path (root: a read-only bind mount, which
    even root cannot write), or, for another user, with every write permission taken away."""
    import subprocess

    if os.geteuid() == 0:
        mount = folder.with_name(folder.name + "-read-only")
        mount.mkdir()
        made = subprocess.run(["mount", "--bind", str(folder), str(mount)], capture_output=True)
        if made.returncode or subprocess.run(["mount", "-o", "remount,ro,bind", str(mount)],
                                             capture_output=True).returncode:  # fmt: skip
            if not made.returncode:
                subprocess.run(["umount", str(mount)])
            mount.rmdir()
            pytest.skip(f"a read-only bind mount cannot be made here ({made.stderr.decode()[:200]})")
        try:
            yield mount
        finally:  # lazily: the commands run in this process may still hold a database of it open
            subprocess.run(["umount", "-l", str(mount)])
            mount.rmdir()
        return
    modes = {p: p.stat().st_mode for p in [folder, *folder.rglob("*")] if not p.is_symlink()}
    for path, mode in modes.items():
        path.chmod(mode & ~0o222)
    try:
        yield folder
    finally:
        for path, mode in modes.items():
            path.chmod(mode)


@pytest.mark.slow
def test_the_reading_commands_work_on_a_workdir_that_cannot_be_written(rebuilt_as_built, tmp_path, capsys):
    """A shared model folder, a container's volume: search, export, catalog and mule.api read
    a read-only workdir, saying once that nothing is logged there; writing into a place that
    cannot be written is one line naming it."""
    import shutil

    from mule import api
    from mule.commands.main import main

    wd, _ = rebuilt_as_built
    copy = tmp_path / "shared" / "work"
    shutil.copytree(wd.root, copy, symlinks=True)
    with read_only(copy) as mounted:
        capsys.readouterr()
        assert main(["search", "a red circle on the left", "--workdir", str(mounted), "--k", "2"]) == 0
        out, err = capsys.readouterr()
        assert "query in en" in out and "cannot be written" in err and "nothing is logged there" in err
        assert main(["catalog", "--workdir", str(mounted)]) == 0
        assert main(["export", "--workdir", str(mounted), "--out", str(tmp_path / "export"), "--no-onnx"]) == 0
        assert api.load(mounted).languages == ["en", "de", "fr", "cs"]
        capsys.readouterr()
        assert main(["embed", "--workdir", str(mounted), "--images", str(mounted / "raw" / "embedded" / "images"),
                     "--out", str(mounted / "vectors")]) == 2  # fmt: skip
        err = capsys.readouterr().err
        assert f"cannot write {mounted / 'vectors'}" in err and "Traceback" not in err
