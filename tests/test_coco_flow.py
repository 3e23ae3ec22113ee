"""End to end on a tiny COCO-style embedded dataset: the rebuild reads en/ja/zh, and a
language added to a trained model leaves the other languages' recalls exactly as they were."""

from __future__ import annotations

import pytest

TINY = {
    "data.dataset": "embedded-coco",
    "add.words": 1000,  # an added language's commonest words read by e5: the mechanics, not the default 50,000
    "data.train_images": 160,
    "data.val_images": 8,
    "data.test_images": 12,
    "data.image_size": 48,
    "features.input_size": 32,
    "vectors.fasttext_epochs": 2,
    "vectors.fasttext_buckets": 100_000,
    "text.word_dim": 64,
    "pretrain.epochs": 1,
    "pretrain.batch_images": 16,
    "train.epochs": 2,
    "train.batch_images": 16,
    "loss.mining_warmup_steps": 10,  # one epoch of 160 images
    "pretrain.mining_warmup_steps": 10,
    "eval.examples": 0,
}


@pytest.mark.slow
def test_coco_rebuild_then_add_a_language(tmp_path):
    from mule.flows.stages import add_language_flow, rebuild_flow

    results = rebuild_flow(workdir=str(tmp_path), overrides=TINY,
                           stages=["ingest", "features", "text", "pretrain", "train", "evaluate"])  # fmt: skip
    assert results["ingest"]["per_split"]["test"]["images"] == 12
    assert set(results["evaluate"]["table"]) == {"en", "ja", "zh"}

    added = add_language_flow(workdir=str(tmp_path), overrides={**TINY, "add.languages": "zh"})
    rows = added["rows"]
    assert set(rows) == {"without zh", "without zh, then zh added", "every language from scratch"}
    assert set(rows["without zh"]) == {"en", "ja"} and set(rows["without zh, then zh added"]) == {"en", "ja", "zh"}
    assert added["existing_languages_max_change"] == 0.0
    for lang in ("en", "ja"):  # the base languages' recalls, to the last digit
        assert rows["without zh, then zh added"][lang] == rows["without zh"][lang]
    assert (tmp_path / "results/embedded-coco/add-language-zh.md").exists()
    # every model is decided by the stage's key for its config: the rebuild's own model is
    # the "from scratch" row, and a second run trains nothing at all
    assert added["steps"]["every language from scratch: train"] == "reused"
    assert added["steps"]["without zh: train"] == added["steps"]["without zh, then zh added: extend"] == "ran"
    again = add_language_flow(workdir=str(tmp_path), overrides={**TINY, "add.languages": "zh"})
    assert set(again["steps"].values()) == {"reused"} and again["rows"] == rows

    # A model the user trained, named as the base: measured as it is and extended, with
    # nothing retrained and no from-scratch row (the English branch reading the Chinese
    # queries translated word by word beside); a base that is not there is said, by path.
    named = add_language_flow(workdir=str(tmp_path),
                              overrides={**TINY, "add.languages": "zh", "add.base_model": "without-zh"})  # fmt: skip
    assert set(named["rows"]) == {"without-zh", "without-zh+zh", "translated queries"}
    assert not [step for step in named["steps"] if step.endswith((": train", ": pretrain"))]
    assert named["rows"]["without-zh"] == rows["without zh"]
    assert named["rows"]["without-zh+zh"]["en"] == rows["without zh"]["en"]
    assert set(named["rows"]["translated queries"]) == {"zh"}
    from mule.mule_core.settings import ConfigError

    with pytest.raises(ConfigError, match=r"add.base_model='nothing-here': no model at .*nothing-here\.pt"):
        add_language_flow(
            workdir=str(tmp_path), overrides={**TINY, "add.languages": "zh", "add.base_model": "nothing-here"}
        )
