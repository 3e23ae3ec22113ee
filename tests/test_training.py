"""The trainer: it learns, keeps the best validation epoch, and resumes exactly."""

import numpy as np
import pytest
import torch

from mule_core.config import LossConfig, ModelConfig
from mule_core.model import MuleModel
from mule_core.training import OptimConfig, SplitTensors, Trainer, evaluate_split

LANGS = ["en", "fr"]


def toy_split(n_images=24, seed=0) -> SplitTensors:
    """Image i has features one-hot(i); its captions say word i (en: 2 captions, fr: 1)."""
    rows = [(i, 0) for i in range(n_images) for _ in range(2)] + [(i, 1) for i in range(n_images)]
    image = np.array([r[0] for r in rows])
    lang = np.array([r[1] for r in rows])
    tokens = torch.tensor([[2 + i, 2 + (i * 7) % n_images] for i in image])
    return SplitTensors(LANGS, tokens, torch.full((len(rows),), 2), lang, image, [f"img{i}" for i in range(n_images)],
                        torch.eye(n_images) + 0.01 * torch.randn(n_images, n_images, generator=torch.Generator().manual_seed(seed)))  # fmt: skip


def toy_model(n_images=24) -> MuleModel:
    torch.manual_seed(0)
    model = MuleModel(LANGS, {"en": n_images + 2, "fr": n_images + 2}, 8, n_images,
                      ModelConfig(mule_dim=16, lstm_dim=16, joint_dim=16, image_hidden=32))  # fmt: skip
    for lang in LANGS:
        model.branches[lang].init_vectors(torch.randn(n_images + 2, 8))
    model.set_image_normalization(toy_split(n_images).features)
    return model


LOSS = LossConfig(margin=0.2, top_k=5, warmup_epochs=1, lc_weight=0.1)


def optim(epochs):
    return OptimConfig(epochs=epochs, lr=3e-3, batch_images=8, sentences_per_image={"en": 2, "fr": 1})


def test_training_learns_a_learnable_task():
    data = toy_split()
    model = toy_model()
    before = evaluate_split(model, data, torch.device("cpu"))
    Trainer(model, data, LOSS, optim(25), torch.device("cpu")).fit()
    after = evaluate_split(model, data, torch.device("cpu"))
    for lang in LANGS:
        assert after[lang]["mR"] > before[lang]["mR"] + 30, (before, after)


def test_the_best_validation_epoch_is_kept():
    scores = iter([1.0, 5.0, 3.0])
    kept = {}

    def validate(m):
        kept[len(kept) + 1] = {k: v.clone() for k, v in m.state_dict().items()}
        return next(scores), {}

    model = toy_model()
    trainer = Trainer(model, toy_split(), LOSS, optim(3), torch.device("cpu"), validate=validate)
    history = trainer.fit()
    assert [r.is_best for r in history] == [True, True, False]
    assert trainer.best_epoch == 2 and trainer.best_score == 5.0
    for key, value in model.state_dict().items():
        assert torch.equal(value, kept[2][key]), key  # the model holds epoch 2's weights, not epoch 3's


@pytest.mark.parametrize("mode", ["joint", "lp"])
def test_resuming_from_a_checkpoint_gives_the_same_model(mode):
    data = toy_split()
    straight = Trainer(toy_model(), data, LOSS, optim(3), torch.device("cpu"), mode=mode)
    straight.fit()

    first = Trainer(toy_model(), data, LOSS, optim(3), torch.device("cpu"), mode=mode)
    first.run_epoch()
    first.run_epoch()
    checkpoint = first.state_dict()
    resumed = Trainer(toy_model(), data, LOSS, optim(3), torch.device("cpu"), mode=mode)
    resumed.load_state_dict(checkpoint)
    assert resumed.epoch == 2
    resumed.fit()
    for key, value in straight.model.state_dict().items():
        assert torch.allclose(value, resumed.model.state_dict()[key], atol=1e-6), key


def test_lp_trains_only_the_mule_layers():
    model = toy_model()
    lstm_before = model.encoder.lstm.weight_ih_l0.detach().clone()
    fc_before = model.branches["fr"].fc.weight.detach().clone()
    Trainer(model, toy_split(), LOSS, optim(2), torch.device("cpu"), mode="lp").fit()
    assert torch.equal(model.encoder.lstm.weight_ih_l0, lstm_before)
    assert not torch.equal(model.branches["fr"].fc.weight, fc_before)


def test_switches_turn_losses_off():
    from dataclasses import replace

    trainer = Trainer(toy_model(), toy_split(), replace(LOSS, nc=False, lc=False), optim(1), torch.device("cpu"))
    batch = next(trainer.sampler.batches(1))
    assert set(trainer.losses(batch)) == {"match", "word_l2"}
    full = Trainer(toy_model(), toy_split(), LOSS, optim(1), torch.device("cpu"))
    assert {"match", "nc_mule", "nc_joint", "lc"} <= set(full.losses(batch))


def test_parallel_embn_trains_with_nc_at_the_multimodal_layer_only():
    model = MuleModel(LANGS, {"en": 26, "fr": 26}, 8, 24,
                      ModelConfig(sharing="parallel", lstm_dim=16, joint_dim=16, image_hidden=32))  # fmt: skip
    model.set_image_normalization(toy_split().features)
    trainer = Trainer(model, toy_split(), LOSS, optim(1), torch.device("cpu"))
    parts = trainer.losses(next(trainer.sampler.batches(1)))
    assert {"match", "nc_joint"} <= set(parts) and "nc_mule" not in parts and "lc" not in parts
    with pytest.raises(ValueError, match="LP pretrains the MULE layer"):
        Trainer(model, toy_split(), LOSS, optim(1), torch.device("cpu"), mode="lp")


def test_balanced_language_groups_reach_the_sampler():
    from dataclasses import replace

    trainer = Trainer(
        toy_model(), toy_split(), LOSS, replace(optim(1), balance_language_groups=True), torch.device("cpu")
    )
    assert trainer.sampler.balance_groups


def test_adding_a_language_trains_it_and_leaves_the_others_bit_identical():
    from dataclasses import replace

    from mule_core.model import with_added_language

    n = 24
    cfg = ModelConfig(mule_dim=16, lstm_dim=16, joint_dim=16, image_hidden=32)
    torch.manual_seed(0)
    base = MuleModel(["en"], {"en": n + 2}, 8, n, cfg)
    base.branches["en"].init_vectors(torch.randn(n + 2, 8))
    data = toy_split(n)
    base.set_image_normalization(data.features)
    english = SplitTensors(["en"], data.tokens[data.caption_lang == 0], data.lengths[data.caption_lang == 0],
                           data.caption_lang[data.caption_lang == 0], data.caption_image[data.caption_lang == 0],
                           data.image_ids, data.features)  # fmt: skip
    Trainer(base, english, LOSS, replace(optim(15), sentences_per_image={"en": 2}), torch.device("cpu")).fit()
    before = evaluate_split(base, english, torch.device("cpu"))
    from mule_core.training import encode_split

    reference = encode_split(base, english, torch.device("cpu"))

    model = with_added_language(base, cfg, "fr", n + 2, torch.randn(n + 2, 8))
    assert {name for name, p in model.named_parameters() if p.requires_grad} == {
        "branches.fr.embed.weight", "branches.fr.fc.weight", "branches.fr.fc.bias"}  # fmt: skip
    untrained = evaluate_split(model, data, torch.device("cpu"))["fr"]["mR"]
    # LC stays off: its classifier is frozen while a language is added
    Trainer(model, data, replace(LOSS, lc=False), optim(25), torch.device("cpu")).fit()
    after = evaluate_split(model, data, torch.device("cpu"))
    assert after["fr"]["mR"] > untrained + 15, (untrained, after)
    assert after["en"] == before["en"]
    again = encode_split(model, english, torch.device("cpu"))
    for key in ("caption_mule", "caption_joint", "image"):  # bit-identical, not merely close
        assert torch.equal(again[key], reference[key]), key
    # BatchNorm's running statistics in the frozen image branch did not move either
    assert torch.equal(model.image_branch[1].running_mean, base.image_branch[1].running_mean)
