"""Dense updates of the word and n-gram tables with gradients built by hand
(mule_core/training/dense_tables.py): the L2 pull's and the rows a batch read, the same numbers as
autograd's, step after step."""

from dataclasses import replace

import pytest
import torch

from mule.mule_core.training.dense_tables import DenseTables
from mule.mule_core.training.loop import Trainer
from mule.mule_core.training.lp import LPTrainer
from tests.test_training import LOSS, amp_on_the_cpu, lp, optim, toy_model, toy_split

PULLED = replace(LOSS, word_l2=0.05)  # strong enough that the pull is a visible part of each gradient


def trainer(by_hand: bool, **train) -> Trainer:
    model = toy_model()
    with torch.no_grad():  # the tables away from their initial vectors: a pull on every row
        for branch in model.branches.values():
            branch.embed.weight.add_(0.1 * torch.randn_like(branch.embed.weight))
    made = LPTrainer(model, toy_split(), PULLED, replace(optim(2), **train), torch.device("cpu"), pretrain=lp(2))
    if not by_hand:  # autograd's gradients: what the trainer did before dense_tables.py
        made.updates.dense_tables = None
        for branch in model.branches.values():
            branch.embed.sparse = branch.subwords.vectors.sparse = False
    return made


def test_the_pull_and_its_gradient_by_hand_on_two_rows():
    """Two rows of 2 numbers, initial vectors 0: the pull is 0.05 * (1 + 4 + 9 + 16) = 1.5 and its
    gradient 2 * 0.05 * W; a batch that read row 1 with gradient (1, 1) adds that to row 1."""
    branch = torch.nn.Module()
    branch.embed = torch.nn.Embedding(2, 2)
    branch.initial = torch.zeros(2, 2)
    branch.subwords = None
    with torch.no_grad():
        branch.embed.weight.copy_(torch.tensor([[1.0, 2.0], [3.0, 4.0]]))
    tables = DenseTables([branch], 0.05)
    assert branch.embed.sparse  # the batch's rows come as a sparse gradient
    assert float(tables.pull_loss()) == pytest.approx(1.5)
    branch.embed(torch.tensor([1])).sum().backward()
    tables.gradients()
    expected = torch.tensor([[0.1, 0.2], [0.3 + 1.0, 0.4 + 1.0]])
    assert not branch.embed.weight.grad.is_sparse
    assert torch.allclose(branch.embed.weight.grad, expected)


def test_the_gradient_by_hand_is_autograd_s_to_the_bit():
    batches = {}
    for by_hand in (True, False):
        made = trainer(by_hand)
        batch = next(iter(made.sampler.batches(1)))
        parts = made.losses(batch)
        sum(v for k, v in parts.items() if k != "lc_accuracy").backward()
        if made.updates.dense_tables is not None:
            made.updates.dense_tables.gradients()
        grads = [t.grad.clone() for b in made.model.branches.values() for t in (b.embed.weight, b.subwords.vectors.weight)]
        batches[by_hand] = (float(parts["word_l2"].detach()), grads)
    assert batches[True][0] == pytest.approx(batches[False][0], rel=1e-6)
    for mine, autograd in zip(batches[True][1], batches[False][1]):
        assert not mine.is_sparse and torch.equal(mine, autograd)


@pytest.mark.parametrize("settings", [{}, {"grad_clip": 0.5, "ema": 0.9}], ids=["plain", "clipped and averaged"])
def test_lp_trains_the_same_weights_with_the_gradient_by_hand(settings):
    weights = {}
    for by_hand in (True, False):
        made = trainer(by_hand, **settings)
        history = made.fit()
        assert history[-1].losses["word_l2"] > 0
        weights[by_hand] = made.kept_model.state_dict()
    for name, mine in weights[True].items():
        assert torch.equal(mine, weights[False][name]), name


def test_a_language_no_batch_read_gets_autograd_s_gradients_none_for_its_n_grams():
    """A batch without French: its n-gram table gets no gradient (Adam leaves the table and
    its moments as they are), its word table the pull's alone, as autograd had it."""
    grads = {}
    for by_hand in (True, False):
        made = trainer(by_hand)
        model = made.model
        pull = made.updates.dense_tables.pull_loss() if by_hand else PULLED.word_l2 * model.word_drift()
        total = model.branches["en"](torch.tensor([[2, 3, 4]])).sum() + pull
        total.backward()
        if by_hand:
            made.updates.dense_tables.gradients()
        grads[by_hand] = {f"{lang}.{name}": None if t.grad is None else t.grad.clone()
                          for lang, b in model.branches.items()
                          for name, t in (("words", b.embed.weight), ("ngrams", b.subwords.vectors.weight))}  # fmt: skip
    assert grads[True]["fr.ngrams"] is None and grads[False]["fr.ngrams"] is None
    for name, autograd in grads[False].items():
        mine = grads[True][name]
        assert (mine is None) == (autograd is None), name
        if autograd is not None:
            assert torch.equal(mine, autograd), name


def poisoned_at(made: Trainer, step: int | None) -> Trainer:
    """At one step (None: every step), a loss term worth 0 whose gradient is NaN (sqrt's at 0,
    times 0): clipping by the NaN norm then spreads NaN over every gradient, every row of every table."""
    losses = made.losses

    def with_poison(batch):
        parts = losses(batch)
        if step is None or made.step == step:
            parts["poison"] = (0.0 * made.model.branches["en"].fc.weight.sum()).sqrt()
        return parts

    made.losses = with_poison
    return made


def test_lp_under_float16_autocast_skips_no_step_and_learns():
    """The losses reach AMP's scaler in float32, so its first scale (65,536, over float16's
    largest number) overflows nothing: no step is skipped. (On CUDA, before, every LP and
    joint step of the demo and the real run was skipped: test recall at chance.)"""
    made = amp_on_the_cpu(trainer(True, grad_clip=2.0, ema=0.99))
    before = {k: v.clone() for k, v in made.model.state_dict().items()}
    history = made.fit()
    assert made.updates.scaler.get_scale() == 65536.0
    assert history[-1].losses["total"] < history[0].losses["total"]
    moved = [k for k, v in made.model.state_dict().items() if v.is_floating_point() and not torch.equal(v, before[k])]
    assert any(".embed." in k for k in moved) and any(".subwords." in k for k in moved)


@pytest.mark.parametrize("amp", [False, True], ids=["a rollback after NaN weights", "a step AMP skips"])
def test_a_step_with_nan_gradients_leaves_nothing_in_the_dense_gradients(amp):
    """Step 4's gradients are NaN and clipping spreads the NaN over every row. Under AMP the
    scaler skips the step; in float32 the weights turn NaN and the divergence guard rolls
    back. Either way the steps after it must train as autograd's fresh gradients do: the same
    weights to the bit. (The hand-built n-gram gradients, zeroed only on the rows the last
    batch read, kept the NaN: every later step was skipped, or rolled back into NaN again.)"""
    weights, histories = {}, {}
    for by_hand in (True, False):
        made = poisoned_at(trainer(by_hand, grad_clip=0.5, ema=0.9), step=4)
        made.schedule = replace(made.schedule, epochs=4)  # LP's (2 in lp()): the poisoned step 4 in the second
        if amp:
            amp_on_the_cpu(made)
        history = made.fit()
        histories[by_hand] = [(h.action, repr(h.losses["total"])) for h in history]  # nan == nan
        weights[by_hand] = made.kept_model.state_dict()
        assert made.stopped is None
        assert all(torch.isfinite(v).all() for v in weights[by_hand].values() if v.is_floating_point())
        if amp:
            assert made.updates.scaler.get_scale() == 32768.0  # one step skipped
        else:
            assert history[1].action.startswith("rolled back") and history[2].action is None
    assert histories[True] == histories[False]
    for name, mine in weights[True].items():
        assert torch.equal(mine, weights[False][name]), name


def test_an_epoch_whose_steps_amp_skipped_says_so(caplog):
    made = amp_on_the_cpu(poisoned_at(trainer(True, grad_clip=0.5), step=None))
    made.schedule = replace(made.schedule, epochs=1)
    made.fit()
    assert "lp epoch 1: AMP's scaler skipped 3 of 3 steps (gradients not finite in float16)" in caplog.text


@pytest.mark.parametrize("pull", [0.05, 0.0], ids=["pulled", "no pull"])
def test_each_table_s_gradient_norm_comes_from_the_rows_read(pull):
    """The norms clipping reads (DenseTables.norms) are those of the dense gradients, though
    made from the rows a batch read alone: the word tables' with the pull over every row,
    the n-gram tables' after a second batch (its first batch's rows zeroed again)."""
    made = trainer(True)
    if not pull:
        made = LPTrainer(made.model, toy_split(), replace(LOSS, word_l2=0.0), optim(2), torch.device("cpu"),
                       pretrain=lp(2))  # fmt: skip
    batches = made.sampler.batches(1)
    for _ in range(2):
        made.optimizer.zero_grad(set_to_none=True)
        parts = made.losses(next(batches))
        sum(v for k, v in parts.items() if k != "lc_accuracy").backward()
        made.updates.dense_tables.gradients()
    tables = [t for b in made.model.branches.values() for t in (b.embed.weight, b.subwords.vectors.weight)]
    assert set(made.updates.dense_tables.norms) == {id(t) for t in tables}
    for table in tables:
        exact = torch.linalg.vector_norm(table.grad)
        assert float(exact) > 0
        assert torch.allclose(made.updates.dense_tables.norms[id(table)], exact, rtol=1e-5)
