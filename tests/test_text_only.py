"""A dataset without images (like the real Multi30K text): text stages, LP and
cross-lingual evaluation work; the image stages say there are no images."""

import pytest

from mule_core.config import resolve, to_dict
from tasks.evaluate import evaluate_model
from tasks.features import NoImagesError, extract_features
from tasks.ingest import ingest_captions
from tasks.pretrain import pretrain_mule
from tasks.text import build_word_vectors
from tasks.train import train_model


def test_text_only_dataset(tiny_multi30k, tmp_path):
    cfg = resolve("demo", {"data.dataset": "tiny", "data.source": str(tiny_multi30k), "text.word_dim": 8,
                           "text.fasttext_epochs": 2, "pretrain.epochs": 2, "model.mule_dim": 8, "eval.split": "train"})  # fmt: skip
    config, workdir = to_dict(cfg), str(tmp_path / "work")
    ingest_captions.fn(workdir, config, None)
    with pytest.raises(NoImagesError, match="has no image files"):
        extract_features(workdir, config, None)
    with pytest.raises(NoImagesError, match="text-only stages"):
        train_model.fn(workdir, config, None)
    build_word_vectors.fn(workdir, config, None)
    lp = pretrain_mule.fn(workdir, config, None)
    assert lp["best_epoch"] in (1, 2)
    evaluation = evaluate_model.fn(workdir, config, None)
    assert evaluation["table"] == {} and set(evaluation["cross_lingual"]) == {"mule"}
    pairs = evaluation["cross_lingual"]["mule"]
    assert {"en->fr", "fr->en", "de->cs"} <= set(pairs)
    assert pairs["fr->en"]["queries"] == 2  # two training images, one French caption each
    assert all(0 <= row["r1"] <= row["r5"] <= 100 for row in pairs.values())
    assert (tmp_path / "work" / "results" / "tiny" / "cross_lingual.md").exists()
