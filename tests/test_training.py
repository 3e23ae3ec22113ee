"""The trainer: it learns, keeps the best validation epoch, and resumes exactly."""

import io
import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from mule.mule_core.encoding import evaluate_split
from mule.mule_core.losses import image_sentence_loss, neighborhood_loss
from mule.mule_core.model import MuleModel
from mule.mule_core.settings import LossConfig, ModelConfig, PretrainConfig, TrainConfig
from mule.mule_core.split_tensors import SplitTensors
from mule.mule_core.training.average import BEST_IS_KEPT
from mule.mule_core.training.joint import JointTrainer
from mule.mule_core.training.loop import Trainer
from mule.mule_core.training.lp import LPTrainer

LANGS = ["en", "fr"]


def toy_split(n_images=24, seed=0) -> SplitTensors:
    """Image i has features one-hot(i); its captions say word i (en: 2 captions, fr: 1)."""
    rows = [(i, 0) for i in range(n_images) for _ in range(2)] + [(i, 1) for i in range(n_images)]
    image = np.array([r[0] for r in rows])
    lang = np.array([r[1] for r in rows])
    tokens = torch.tensor([[2 + i, 2 + (i * 7) % n_images] for i in image])
    return SplitTensors(LANGS, tokens, torch.full((len(rows),), 2), lang, image, [f"img{i}" for i in range(n_images)],
                        torch.eye(n_images) + 0.01 * torch.randn(n_images, n_images, generator=torch.Generator().manual_seed(seed)))  # fmt: skip


def toy_words(n_images=24) -> list[str]:
    return ["<pad>", "<unk>", *(f"word{i}" for i in range(n_images))]


def toy_model(n_images=24) -> MuleModel:
    """The default model (subword vectors included) on the toy vocabulary."""
    torch.manual_seed(0)
    model = MuleModel(LANGS, {"en": n_images + 2, "fr": n_images + 2}, 8, n_images,
                      ModelConfig(mule_dim=16, lstm_dim=16, joint_dim=16, image_hidden=32),
                      {lang: toy_words(n_images) for lang in LANGS})  # fmt: skip
    for lang in LANGS:
        model.branches[lang].init_vectors(torch.randn(n_images + 2, 8))
    model.set_image_normalization(toy_split(n_images).features)
    return model


LOSS = LossConfig(margin=0.2, top_k=5, mining_warmup_steps=3, lc_weight=0.1)  # 3 steps: one epoch


def optim(epochs):
    """The training config of these tests: plain Adam, no decay, clipping or averaging."""
    return TrainConfig(epochs=epochs, lr=3e-3, batch_images=8, sentences_per_image={"en": 2, "fr": 1}, lr_decay=1.0,
                       word_lr_scale=1.0, grad_clip=0.0, ema=0.0)


def lp(epochs):
    """LP's own section: its epochs, learning rate and batch."""
    return PretrainConfig(epochs=epochs, lr=3e-3, batch_images=8)


def trainer_of(mode: str, *args, pretrain: PretrainConfig, **kwargs) -> Trainer:
    """The kind a parametrized test names: LP with its own section, or joint training
    (which has none: `pretrain` goes unused)."""
    return LPTrainer(*args, pretrain=pretrain, **kwargs) if mode == "lp" else JointTrainer(*args, **kwargs)


def test_training_learns_a_learnable_task():
    data = toy_split()
    model = toy_model()
    before = evaluate_split(model, data, torch.device("cpu"))
    JointTrainer(model, data, LOSS, optim(25), torch.device("cpu")).fit()
    after = evaluate_split(model, data, torch.device("cpu"))
    for lang in LANGS:
        assert after[lang]["mR"] > before[lang]["mR"] + 30, (before, after)


def amp_on_the_cpu(made: Trainer) -> Trainer:
    """train.amp as it runs on CUDA (float16 autocast, a GradScaler from 65,536), on the CPU."""
    made.mixed_precision(True)
    return made


def test_training_under_float16_autocast_learns_as_in_float32():
    """train.amp, on the CPU: no step skipped, the task learned. (On CUDA every step of the
    demo's LP and joint training had been skipped, NaN kept in the n-gram gradients: test
    recall at chance; here the toy's mR stayed at 15-17.)"""
    data = toy_split()
    model = toy_model()
    made = amp_on_the_cpu(JointTrainer(model, data, replace(LOSS, word_l2=5e-7), replace(optim(25), grad_clip=2.0, ema=0.99),
                                  torch.device("cpu")))
    made.fit()
    assert made.updates.scaler.get_scale() == 65536.0
    after = evaluate_split(made.kept_model, data, torch.device("cpu"))
    for lang in LANGS:
        assert after[lang]["mR"] > 85, after


def test_the_best_validation_epoch_is_kept():
    scores = iter([1.0, 5.0, 3.0])
    kept = {}

    def validate(m):
        kept[len(kept) + 1] = {k: v.clone() for k, v in m.state_dict().items()}
        return next(scores), {}

    model = toy_model()
    trainer = JointTrainer(model, toy_split(), LOSS, optim(3), torch.device("cpu"), validate=validate)
    history = trainer.fit()
    assert [r.is_best for r in history] == [True, True, False]
    assert trainer.best_epoch == 2 and trainer.best_score == 5.0
    for key, value in model.state_dict().items():
        assert torch.equal(value, kept[2][key]), key  # the model holds epoch 2's weights, not epoch 3's


@pytest.mark.parametrize("mode", ["joint", "lp"])
def test_patience_stops_after_epochs_without_a_better_score_and_keeps_the_same_best_model(mode):
    """Scores 1, 5, 3, 4, 2, 6: with patience 3 the run stops after epoch 5 (three epochs
    since epoch 2's 5.0) and holds epoch 2's weights, the very weights a run of every epoch
    keeps when its best stays epoch 2 (scores 1, 5, 3, 4, 2, 4)."""

    def run(scores: list[float], patience: int) -> tuple[Trainer, dict]:
        queue, kept = iter(scores), {}

        def validate(m):
            kept[len(kept) + 1] = {k: v.clone() for k, v in m.state_dict().items()}
            return next(queue), {}

        train, pre = replace(optim(6), patience=patience), replace(lp(6), patience=patience)
        trainer = trainer_of(mode, toy_model(), toy_split(), LOSS, train, torch.device("cpu"), validate=validate,
                             pretrain=pre)  # fmt: skip
        trainer.fit()
        return trainer, kept

    stopped, kept = run([1.0, 5.0, 3.0, 4.0, 2.0, 6.0], patience=3)
    assert [r.epoch for r in stopped.history] == [1, 2, 3, 4, 5] and stopped.best_epoch == 2
    assert stopped.stopped.startswith("no better validation score for 3 epochs after epoch 2 (5.00)")
    every, _ = run([1.0, 5.0, 3.0, 4.0, 2.0, 4.0], patience=0)
    assert len(every.history) == 6 and every.best_epoch == 2 and every.stopped is None
    for key, value in stopped.model.state_dict().items():
        assert torch.equal(value, kept[2][key]), key
        assert torch.equal(value, every.model.state_dict()[key]), key


def test_a_negative_patience_is_refused():
    from mule.config.resolution import resolve
    from mule.mule_core.settings import ConfigError

    with pytest.raises(ConfigError, match=r"^train.patience must be 0 \(run every epoch\) or a number of epochs, got -1$"):
        resolve("demo", {"train.patience": "-1"})


@pytest.mark.parametrize("updates", ["dense", "rows"])
def test_weight_averaging_validates_and_keeps_the_average_of_the_steps(updates):
    """train.ema: after step t, average <- average + w_t (weights - average), with Adam's bias
    correction w_t = (1 - d) / (1 - d^t); validation sees the average, and the kept model
    is the average of the best epoch, not the raw weights."""
    seen = []

    def validate(m):
        seen.append({k: v.clone() for k, v in m.state_dict().items()})
        return float(len(seen)), {}

    model = toy_model()
    start = {k: v.clone() for k, v in model.state_dict().items()}
    options = replace(optim(1), ema=0.99, word_updates=updates)  # rows: the tables' rows averaged row by row
    trainer = JointTrainer(model, toy_split(), LOSS, options, torch.device("cpu"), validate=validate)
    assert bool(trainer.average.rows if trainer.average else {}) == (updates == "rows")
    expected = {k: v.clone() for k, v in start.items()}
    raw = []  # the raw weights after each step
    original_update = trainer.average.update

    def spy(*step_and_moved):
        raw.append({k: v.detach().clone() for k, v in trainer.model.named_parameters()})
        original_update(*step_and_moved)

    trainer.average.update = spy
    trainer.fit()
    for t, weights in enumerate(raw, start=1):  # the scheduler has counted t steps when the average updates
        weight = (1 - 0.99) / (1 - 0.99**t)  # written out: ema_weight's formula, checked by hand above
        for name, value in weights.items():
            expected[name] = expected[name] + weight * (value - expected[name])
    assert len(raw) == len(trainer.sampler) == 3
    for name, _ in model.named_parameters():
        assert torch.allclose(seen[0][name], expected[name], atol=1e-6), name  # validation saw the average
        assert torch.allclose(model.state_dict()[name], expected[name], atol=1e-6), name  # and it is what is kept
    assert not torch.allclose(model.state_dict()["encoder.fc.weight"], raw[-1]["encoder.fc.weight"])


@pytest.mark.parametrize("mode", ["joint", "lp"])
def test_resuming_from_a_checkpoint_gives_the_same_model(mode):
    data = toy_split()
    straight = trainer_of(mode, toy_model(), data, LOSS, optim(3), torch.device("cpu"), pretrain=lp(3))
    straight.fit()

    first = trainer_of(mode, toy_model(), data, LOSS, optim(3), torch.device("cpu"), pretrain=lp(3))
    first.run_epoch()
    first.run_epoch()
    checkpoint = first.state_dict()
    resumed = trainer_of(mode, toy_model(), data, LOSS, optim(3), torch.device("cpu"), pretrain=lp(3))
    resumed.load_state_dict(checkpoint)
    assert resumed.epoch == 2
    resumed.fit()
    for key, value in straight.model.state_dict().items():
        assert torch.allclose(value, resumed.model.state_dict()[key], atol=1e-6), key


def test_a_checkpoint_names_the_best_epoch_s_copies_when_they_are_the_kept_weights():
    """Right after a best epoch the checkpoint does not store the best weights and optimizer
    state a second time (LP on the real text: 4 copies of 89 M parameters instead of 7);
    resumed, they are there all the same. After an epoch that was not the best, they are stored."""

    def through_a_file(state):  # as Checkpoints writes and reads it: torch's weights_only loader
        buffer = io.BytesIO()
        torch.save(state, buffer)
        return torch.load(io.BytesIO(buffer.getvalue()), weights_only=True), buffer.tell()

    data = toy_split()
    first = JointTrainer(toy_model(), data, LOSS, optim(4), torch.device("cpu"), validate=_mean_mr_on(data))
    first.run_epoch()
    assert first.best_epoch == first.epoch == 1
    now, now_bytes = through_a_file(first.state_dict())
    assert now["best"]["state"] == now["best"]["optimizer"] == BEST_IS_KEPT  # the best epoch's part: its own state
    first.best.score = math.inf  # epoch 2 cannot be the best
    first.run_epoch()
    assert first.best_epoch == 1 and first.epoch == 2
    before, before_bytes = through_a_file(first.state_dict())
    assert isinstance(before["best"]["state"], dict) and isinstance(before["best"]["optimizer"], dict)
    assert now_bytes < 0.7 * before_bytes

    for state, epoch in ((now, 1), (before, 2)):
        resumed = JointTrainer(toy_model(), data, LOSS, optim(4), torch.device("cpu"), validate=_mean_mr_on(data))
        resumed.load_state_dict(state)
        assert resumed.epoch == epoch and resumed.best_epoch == 1
        assert resumed.best_state.keys() == first.best_state.keys()
        assert all(torch.equal(v, first.best_state[k]) for k, v in resumed.best_state.items())
        assert resumed.best_optimizer["param_groups"] == first.best_optimizer["param_groups"]
        for key, moments in first.best_optimizer["state"].items():
            assert all(torch.equal(v, resumed.best_optimizer["state"][key][name]) for name, v in moments.items())


def test_lp_trains_only_the_mule_layers():
    model = toy_model()
    lstm_before = model.encoder.lstm.weight_ih_l0.detach().clone()
    fc_before = model.branches["fr"].fc.weight.detach().clone()
    LPTrainer(model, toy_split(), LOSS, optim(2), torch.device("cpu"), pretrain=lp(2)).fit()
    assert torch.equal(model.encoder.lstm.weight_ih_l0, lstm_before)
    assert not torch.equal(model.branches["fr"].fc.weight, fc_before)


def test_switches_turn_losses_off():

    trainer = JointTrainer(toy_model(), toy_split(), replace(LOSS, nc=False, lc=False), optim(1), torch.device("cpu"))
    batch = next(trainer.sampler.batches(1))
    assert set(trainer.losses(batch)) == {"match", "word_l2"}
    full = JointTrainer(toy_model(), toy_split(), LOSS, optim(1), torch.device("cpu"))
    assert {"match", "nc_mule", "nc_joint", "lc"} <= set(full.losses(batch))


def test_parallel_embn_trains_with_nc_at_the_multimodal_layer_only():
    model = MuleModel(LANGS, {"en": 26, "fr": 26}, 8, 24,
                      ModelConfig(sharing="parallel", lstm_dim=16, joint_dim=16, image_hidden=32),
                      {lang: toy_words() for lang in LANGS})  # fmt: skip
    model.set_image_normalization(toy_split().features)
    trainer = JointTrainer(model, toy_split(), LOSS, optim(1), torch.device("cpu"))
    parts = trainer.losses(next(trainer.sampler.batches(1)))
    assert {"match", "nc_joint"} <= set(parts) and "nc_mule" not in parts and "lc" not in parts
    with pytest.raises(ValueError, match="LP pretrains the MULE layer"):
        LPTrainer(model, toy_split(), LOSS, optim(1), torch.device("cpu"), pretrain=lp(1))


def test_balanced_language_groups_reach_the_sampler():

    trainer = JointTrainer(
        toy_model(), toy_split(), LOSS, replace(optim(1), balance_language_groups=True), torch.device("cpu")
    )
    assert trainer.sampler.balance_groups


@pytest.mark.slow
def test_adding_a_language_trains_it_and_leaves_the_others_bit_identical():

    from mule.mule_core.model import with_added_language

    n = 24
    cfg = ModelConfig(mule_dim=16, lstm_dim=16, joint_dim=16, image_hidden=32)
    torch.manual_seed(0)
    base = MuleModel(["en"], {"en": n + 2}, 8, n, cfg, {"en": toy_words(n)})
    base.branches["en"].init_vectors(torch.randn(n + 2, 8))
    data = toy_split(n)
    base.set_image_normalization(data.features)
    english = SplitTensors(["en"], data.tokens[data.caption_lang == 0], data.lengths[data.caption_lang == 0],
                           data.caption_lang[data.caption_lang == 0], data.caption_image[data.caption_lang == 0],
                           data.image_ids, data.features)  # fmt: skip
    JointTrainer(base, english, LOSS, replace(optim(15), sentences_per_image={"en": 2}), torch.device("cpu")).fit()
    before = evaluate_split(base, english, torch.device("cpu"))
    from mule.mule_core.encoding import encode_split

    reference = encode_split(base, english, torch.device("cpu"))

    model = with_added_language(base, cfg, "fr", n + 2, torch.randn(n + 2, 8), toy_words(n))
    assert {name for name, p in model.named_parameters() if p.requires_grad} == {
        "branches.fr.embed.weight", "branches.fr.subwords.vectors.weight", "branches.fr.fc.weight",
        "branches.fr.fc.bias"}  # fmt: skip
    untrained = evaluate_split(model, data, torch.device("cpu"))["fr"]["mR"]
    # LC stays off: its classifier is frozen while a language is added
    JointTrainer(model, data, replace(LOSS, lc=False), optim(25), torch.device("cpu")).fit()
    after = evaluate_split(model, data, torch.device("cpu"))
    assert after["fr"]["mR"] > untrained + 15, (untrained, after)
    assert after["en"] == before["en"]
    again = encode_split(model, english, torch.device("cpu"))
    for key in ("caption_mule", "caption_joint", "image"):  # bit-identical, not merely close
        assert torch.equal(again[key], reference[key]), key
    # BatchNorm's running statistics in the frozen image branch did not move either
    assert torch.equal(model.image_branch[1].running_mean, base.image_branch[1].running_mean)


# -- the divergence guard -------------------------------------------------------------


def _mean_mr_on(data):
    from mule.mule_core.metrics import mean_mr

    return lambda m: (mean_mr(evaluate_split(m, data, torch.device("cpu"))), {})


def test_an_absurd_learning_rate_fires_the_guard_which_rolls_back_then_stops():

    data = toy_split()
    trainer = JointTrainer(toy_model(), data, LOSS, replace(optim(30), divergence_retries=2), torch.device("cpu"),
                      validate=_mean_mr_on(data))  # fmt: skip
    for _ in range(15):
        trainer.run_epoch()
    learned, best_epoch = trainer.best_score, trainer.best_epoch
    assert learned > 60, learned
    trainer.updates.lr_scale = 1e6  # from the next step on, lr 3e3: training blows up
    history = trainer.fit()
    fired = [r for r in history if r.divergence]
    assert fired and fired[0].epoch == 16, [(r.epoch, r.score, r.losses.get("total")) for r in history]
    assert fired[0].action.startswith(f"rolled back to epoch {best_epoch}, learning rate x500000 (rollback 1 of 2)")
    # lr x 1e6 x 0.5 is as absurd: both rollbacks fail, and the guard stops the run...
    assert [r.epoch for r in fired] == [16, 17, 18], [(r.epoch, r.score) for r in history]
    assert fired[-1].action.startswith("stopped (2 rollbacks did not help)")
    assert trainer.stopped and trainer.epoch == 18 < 30
    # ...with the best epoch's weights, not the diverged ones
    assert trainer.best_epoch == best_epoch
    assert _mean_mr_on(data)(trainer.model)[0] == pytest.approx(learned)


def test_losses_that_are_not_finite_fire_the_guard_even_without_validation():

    model = toy_model()
    start = {k: v.clone() for k, v in model.state_dict().items()}
    trainer = JointTrainer(model, toy_split(), LOSS, replace(optim(5), lr=float("inf")), torch.device("cpu"))
    history = trainer.fit()
    assert "losses not finite" in history[0].divergence
    assert history[0].action.startswith("rolled back to the starting weights")
    assert trainer.stopped and len(history) == 3
    for key, value in model.state_dict().items():  # no epoch was good: back where it started
        assert torch.equal(value, start[key]), key


def test_losses_that_explode_but_stay_finite_fire_the_guard_from_the_first_epoch():
    """lr 1e9 wrecks the model within epoch 1: no good epoch to fall from, losses huge but finite."""

    trainer = JointTrainer(toy_model(), toy_split(), LOSS, replace(optim(5), lr=1e9), torch.device("cpu"))
    history = trainer.fit()
    assert all(math.isfinite(v) for v in history[0].losses.values())
    assert "losses exploded" in history[0].divergence, history[0].losses
    assert [r.epoch for r in history if r.divergence] == [1, 2, 3] and trainer.stopped


def test_a_healthy_run_never_counts_as_exploded():
    data = toy_split()
    trainer = JointTrainer(toy_model(), data, LOSS, optim(15), torch.device("cpu"), validate=_mean_mr_on(data))
    assert not [r for r in trainer.fit() if r.divergence] and trainer.first_loss > 0


@pytest.mark.parametrize("mode", ["stop", "warn", "off"])
def test_the_guard_does_what_the_config_says(mode):

    data = toy_split()
    trainer = JointTrainer(toy_model(), data, LOSS, replace(optim(17), divergence=mode), torch.device("cpu"),
                      validate=_mean_mr_on(data))  # fmt: skip
    for _ in range(15):
        trainer.run_epoch()
    trainer.updates.lr_scale = 1e6
    history = trainer.fit()
    fired = [r for r in history if r.divergence]
    if mode == "off":
        assert not fired and trainer.epoch == 17
    elif mode == "warn":
        assert fired and all(r.action == "warned only (divergence=warn)" for r in fired) and trainer.epoch == 17
    else:
        assert len(fired) == 1 and fired[0].action.startswith("stopped (divergence=stop)") and trainer.epoch == 16


def test_a_resumed_run_keeps_the_guards_state():
    data = toy_split()
    first = JointTrainer(toy_model(), data, LOSS, optim(20), torch.device("cpu"), validate=_mean_mr_on(data))
    for _ in range(15):
        first.run_epoch()
    first.updates.lr_scale = 1e6
    first.run_epoch()  # diverges: rolled back, lr scale 5e5
    assert first.rollbacks == 1
    resumed = JointTrainer(toy_model(), data, LOSS, optim(20), torch.device("cpu"), validate=_mean_mr_on(data))
    resumed.load_state_dict(first.state_dict())
    assert (resumed.rollbacks, resumed.updates.lr_scale, resumed.best_epoch) == (1, first.updates.lr_scale, first.best_epoch)
    assert resumed.optimizer.param_groups[0]["lr"] == first.optimizer.param_groups[0]["lr"]


def test_learning_rate_warms_up_and_decays_in_steps():
    trainer = JointTrainer(toy_model(), toy_split(), LOSS, replace(optim(2), warmup_steps=4, lr_decay=0.5, decay_steps=2),
                      torch.device("cpu"))  # fmt: skip
    lrs = [trainer.optimizer.param_groups[0]["lr"]]
    for _ in range(5):
        trainer.optimizer.step()
        trainer.scheduler.step()
        lrs.append(trainer.optimizer.param_groups[0]["lr"])
    base = 3e-3
    expected = [base * min(1, (s + 1) / 4) * 0.5 ** (s / 2) for s in range(6)]
    assert lrs == pytest.approx(expected)


@pytest.mark.parametrize("mode", ["joint", "lp"])
def test_hard_negatives_are_mined_after_the_warm_up_of_the_mode(mode):
    """Joint training mines the top k after loss.mining_warmup_steps, LP after its own
    pretrain.mining_warmup_steps: before that every negative counts."""
    loss, pretrain = replace(LOSS, mining_warmup_steps=2), replace(lp(2), mining_warmup_steps=4)
    trainer = trainer_of(mode, toy_model(), toy_split(), loss, optim(2), torch.device("cpu"), pretrain=pretrain)
    seen = []

    def recording(*args):
        seen.append(args[4])  # k: how many of each anchor's violations count
        return neighborhood_loss(*args)

    trainer._neighborhood_loss = recording
    trainer.fit()
    every = 8 * 64  # batch_images x 64: more than any batch's candidates
    calls = 1 if mode == "lp" else 2  # joint: NC at the MULE and the joint layer
    steps = 6  # 2 epochs of 3 batches
    warm = 4 if mode == "lp" else 2
    assert seen == [every] * (calls * warm) + [LOSS.top_k] * (calls * (steps - warm))


@pytest.mark.parametrize("mode", ["joint", "lp"])
def test_each_mode_keeps_its_own_margin(mode):
    """LP's hinges use pretrain.margin, joint training's loss.margin, in every loss."""
    loss, pretrain = replace(LOSS, margin=0.1), replace(lp(1), margin=0.4)
    trainer = trainer_of(mode, toy_model(), toy_split(), loss, optim(1), torch.device("cpu"), pretrain=pretrain)
    seen = []

    def recording(loss_function):
        def record(*args):
            seen.append(args[3])  # margin: the fourth argument of both losses
            return loss_function(*args)

        return record

    trainer._neighborhood_loss = recording(neighborhood_loss)
    trainer._image_sentence_loss = recording(image_sentence_loss)
    trainer.fit()
    assert seen and set(seen) == {0.4 if mode == "lp" else 0.1}


def test_the_adversary_ramps_up_in_steps():
    trainer = JointTrainer(toy_model(), toy_split(), replace(LOSS, lc_weight=0.2, lc_ramp_steps=100), optim(1),
                      torch.device("cpu"))  # fmt: skip
    assert trainer.lc_scale() == 0.0
    trainer.scheduler.last_epoch = 50
    assert trainer.lc_scale() == pytest.approx(0.2 * (2 / (1 + np.exp(-5)) - 1))
    trainer.scheduler.last_epoch = 500
    assert trainer.lc_scale() == pytest.approx(0.2 * (2 / (1 + np.exp(-10)) - 1))


def test_the_weight_average_uses_its_decay_from_the_first_step():
    """train.ema is Adam's bias-corrected average: after t steps the kept weights are the
    d-weighted mean of every step's weights (d^(t-i), normalised), checkable by hand.
    d = 0.5 over weights 1, 2, 3: (0.25*1 + 0.5*2 + 1*3) / 1.75 = 2.4286. And two decays
    differ from the first steps on (the former warm-up held every d >= 0.999 at
    (1+t)/(10+t) until step 8,990: 0.999 and 0.9995 were one run)."""
    from mule.mule_core.training.average import ema_weight

    assert [ema_weight(0.5, t) for t in (1, 2, 3)] == pytest.approx([1.0, 2 / 3, 4 / 7])
    average = 0.0
    for step, weights in enumerate([1.0, 2.0, 3.0], start=1):
        average += (weights - average) * ema_weight(0.5, step)
    assert average == pytest.approx(4.25 / 1.75)
    assert ema_weight(0.999, 750) != pytest.approx(ema_weight(0.9995, 750), rel=0.1)
    assert ema_weight(0.999, 750) == pytest.approx(0.001 / (1 - 0.999**750))
    assert ema_weight(0.0, 10) == 1.0


def test_lp_and_joint_training_take_sentences_per_image_from_their_own_sections():
    """en has two captions per image here: LP takes pretrain.sentences_per_image_many of
    them, joint training train.sentences_per_image_many; fr has one either way."""
    train = replace(optim(1), sentences_per_image={}, sentences_per_image_many=2)
    pretrain = replace(lp(1), sentences_per_image_many=1)
    cpu = torch.device("cpu")
    assert LPTrainer(toy_model(), toy_split(), LOSS, train, cpu, pretrain=pretrain).sentences_per_image == {
        "en": 1, "fr": 1}  # fmt: skip
    assert JointTrainer(toy_model(), toy_split(), LOSS, train, cpu).sentences_per_image == {
        "en": 2, "fr": 1}  # fmt: skip


@pytest.mark.parametrize("mode", ["joint", "lp"])
def test_each_mode_decays_its_learning_rate_and_averages_its_weights_by_its_own_section(mode):
    """LP takes pretrain.lr_decay (per epoch: its own steps) and pretrain.ema, joint
    training train.lr_decay and train.ema; 1.0 and 0 are a constant rate and the last
    weights. Toy split: 3 batches an epoch, so after 2 epochs lr = lr0 x decay^2."""
    train = replace(optim(2), lr_decay=0.5, ema=0.0, decay_steps=0)
    pretrain = replace(lp(2), lr_decay=0.25, ema=0.9)
    trainer = trainer_of(mode, toy_model(), toy_split(), LOSS, train, torch.device("cpu"), pretrain=pretrain)
    lr0 = trainer.optimizer.param_groups[0]["lr"]
    trainer.fit()
    assert trainer.step == 6
    decay = 0.25 if mode == "lp" else 0.5
    assert trainer.optimizer.param_groups[0]["lr"] == pytest.approx(lr0 * decay**2)
    if mode == "lp":  # the kept model is the average, not the last weights
        assert trainer.average is not None and trainer.kept_model is trainer.average.model
        kept, last = trainer.kept_model.state_dict(), trainer.model.state_dict()
        assert any(not torch.equal(kept[name], last[name]) for name in last)
    else:
        assert trainer.average is None and trainer.kept_model is trainer.model
