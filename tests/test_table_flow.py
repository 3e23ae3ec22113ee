"""A language outside the six, end to end on the generated table layout (a photo folder
and captions.csv in English and Spanish): ingest, word vectors, LP, joint training,
evaluation, a Spanish search through `mule serve`, and the registered pyfunc model giving
the same vector. (Adding a language, study and all, is tests/test_add_language.py's and
tests/test_coco_flow.py's.)"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.parse
import urllib.request

import numpy as np
import pytest

from tests.test_serving import _wait_for, free_port

TINY = {
    "data.dataset": "embedded-table",
    "data.train_images": 64,
    "data.val_images": 16,
    "data.test_images": 16,
    "data.image_size": 48,
    "features.input_size": 32,
    "vectors.fasttext_epochs": 3,
    "vectors.fasttext_buckets": 100_000,
    "text.word_dim": 64,
    "pretrain.epochs": 2,
    "pretrain.batch_images": 16,
    "train.epochs": 6,
    "train.batch_images": 16,
    "loss.mining_warmup_steps": 4,  # one epoch of 64 images
    "pretrain.mining_warmup_steps": 4,
    "eval.examples": 0,
}


@pytest.mark.slow
def test_spanish_through_every_stage_and_mule_serve(tmp_path):
    import mlflow
    import pandas as pd

    from mule.flows.stages import rebuild_flow

    results = rebuild_flow(workdir=str(tmp_path), overrides=TINY,
                           stages=["ingest", "features", "text", "pretrain", "train", "evaluate"])  # fmt: skip
    ingest = results["ingest"]
    assert ingest["per_split"]["test"] == {"images": 16, "en": 32, "es": 32}
    assert ingest["table"]["form"] == "long" and ingest["tokenizers"]["es"].startswith("moses")
    table = results["evaluate"]["table"]
    assert set(table) == {"en", "es"}

    # mule serve: a Spanish test caption finds images, its language detected from the vocabularies
    from mule.data_catalog.tables import Catalog
    from mule.storage.workdir import Workdir

    wd = Workdir.at(tmp_path)
    captions = Catalog(wd, read_only=True).read_table("captions", "embedded-table").to_pylist()
    spanish = next(c for c in captions if c["lang"] == "es" and c["role"] == "test")
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "mule.commands", "serve", "--workdir", str(tmp_path),
                               "--dataset", "embedded-table", "--port", str(port)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    try:
        _wait_for(f"http://127.0.0.1:{port}/api/info", server, 120)
        query = urllib.parse.quote(spanish["text"])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/search?q={query}&k=5", timeout=30) as answer:
            found = json.load(answer)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/embed?q={query}", timeout=30) as answer:
            served_vector = np.array(json.load(answer)["vector"], dtype=np.float32)
        # an image id is its path in the table (photos/test/test-000001.jpg): its picture is served
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{found['results'][0]['url']}", timeout=30) as answer:
            picture = (answer.headers["content-type"], answer.read()[:3])
    finally:
        server.terminate()
        server.wait(timeout=20)
    assert found["lang"] == "es" and found["language"].startswith("detected: es")
    assert len(found["results"]) == 5 and found["gallery"] == 96  # every split's images
    assert found["results"][0]["image_id"].startswith("photos/") and picture == ("image/jpeg", b"\xff\xd8\xff")

    # the registered model: the same Spanish vector
    mlflow.set_tracking_uri(wd.mlflow_uri)
    model = mlflow.pyfunc.load_model("models:/mule-embedded-table@champion")
    out = model.predict(pd.DataFrame({"text": [spanish["text"]], "lang": ["es"]}))
    assert np.allclose(np.array(out["embedding"][0], dtype=np.float32), served_vector, atol=1e-5)


def test_rows_appended_to_a_users_table_extract_only_the_new_images(tmp_path, caplog):
    """(And a language with far fewer training images than retrieval needs is warned about.)"""
    import logging

    from PIL import Image

    from mule.config.resolution import resolve
    from mule.pipeline.runner import run_alone
    from mule.storage.workdir import Workdir

    photos = tmp_path / "my-photos"
    (photos / "shoes").mkdir(parents=True)
    for n in range(8):
        Image.new("RGB", (40, 30), (30 * n, 90, 200 - 20 * n)).save(photos / "shoes" / f"{n}.jpg")
    rows = [f"shoes/{n}.jpg,Un zapato número {n}.,es" for n in range(5)]
    (photos / "metadata.csv").write_text("file_name,caption,lang\n" + "\n".join(rows) + "\n", encoding="utf-8")
    overrides = {"data.dataset": "shop", "data.source": str(photos), "data.languages": "es", "features.input_size": 32}
    cfg = resolve("demo", overrides)
    assert cfg.data.format == "table"  # found by the metadata.csv in --source
    wd = Workdir.at(tmp_path / "work")
    with caplog.at_level(logging.WARNING, logger="mule"):
        assert run_alone(wd, cfg, "ingest", force=False)["images"] == 5
    warned = [r.getMessage() for r in caplog.records if "training image(s)" in r.getMessage()]
    assert len(warned) == 1 and re.match(r"es has captions for [1-5] training image\(s\); retrieval becomes useful "
                                         r"at about 1,000 per language", warned[0]), warned  # fmt: skip
    assert run_alone(wd, cfg, "features", force=False)["extracted_now"] == 5
    more = [f"shoes/{n}.jpg,\"Otro zapato, el {n}.\",es" for n in (1, 5, 6, 7)]  # one old image, three new
    (photos / "metadata.csv").write_text("file_name,caption,lang\n" + "\n".join(rows + more) + "\n", encoding="utf-8")
    assert run_alone(wd, cfg, "ingest", force=False)["images"] == 8
    features = run_alone(wd, cfg, "features", force=False)
    assert features["extracted_now"] == 3 and features["images"] == 8


def test_mule_catalog_lists_the_rejected_rows_with_file_line_and_reason(tmp_path, capsys):
    from PIL import Image

    from mule.commands.main import main
    from mule.config.resolution import resolve
    from mule.pipeline.runner import run_alone
    from mule.storage.workdir import Workdir

    photos = tmp_path / "my-photos"
    photos.mkdir()
    Image.new("RGB", (20, 20), (200, 10, 10)).save(photos / "a.jpg")
    (photos / "captions.csv").write_text("image,text,language\na.jpg,Un zapato rojo.,es\nb.jpg,Un zapato.,es\n"
                                         "a.jpg,Czerwony but.,xyzzy\n", encoding="utf-8")  # fmt: skip
    cfg = resolve("demo", {"data.dataset": "shop", "data.source": str(photos), "data.languages": "es"})
    run_alone(Workdir.at(tmp_path / "work"), cfg, "ingest")
    assert main(["catalog", "--workdir", str(tmp_path / "work"), "--rejects"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "shop  captions.csv:3  no_image: image file 'b.jpg' not found (looked in " + str(photos) + ")"
    assert out[1] == "    b.jpg,Un zapato.,es"
    assert out[2].startswith("shop  captions.csv:4  bad_language: column 'language': 'xyzzy' is not a language code")


def test_an_ingest_that_finds_no_usable_caption_keeps_its_rejects_for_mule_catalog(tmp_path, capsys):
    """A Parquet lang column of numbers: ingest stops (no es caption is left), and the rows
    it rejected, with why, are what `mule catalog --rejects` shows: the error says so."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from PIL import Image

    from mule.commands.main import main
    from mule.config.resolution import resolve
    from mule.pipeline.runner import run_alone
    from mule.storage.workdir import Workdir

    photos = tmp_path / "my-photos"
    photos.mkdir()
    Image.new("RGB", (20, 20), (200, 10, 10)).save(photos / "a.jpg")
    pq.write_table(pa.table({"file_name": ["a.jpg", "a.jpg"], "caption": ["Un zapato rojo.", "Un zapato."],
                             "lang": [1, 2]}), photos / "metadata.parquet")  # fmt: skip
    cfg = resolve("demo", {"data.dataset": "shop", "data.source": str(photos), "data.languages": "es"})
    with pytest.raises(Exception, match=r"no usable es captions in the table \(its languages: none; 2 rejected for a "
                                        r"lang that names no language: `mule catalog --rejects` lists them\)"):  # fmt: skip
        run_alone(Workdir.at(tmp_path / "work"), cfg, "ingest")
    assert main(["catalog", "--workdir", str(tmp_path / "work"), "--rejects"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == ("shop  metadata.parquet:1  bad_language: column 'lang': 1 is a number, not a language code (a BCP "
                      "47 tag such as es, pl or pt-BR, or a language's name)")  # fmt: skip
    assert any(line.startswith("shop  metadata.parquet:2  bad_language: column 'lang': 2 is a number") for line in out)
