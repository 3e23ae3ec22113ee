"""Row-wise updates of the word tables (train.word_updates=rows): a batch steps the rows it
read and no other, with Adam's rule on those rows, and the weight average of a row that sat
still is brought up to date in closed form."""

from dataclasses import replace

import pytest
import torch

from mule.mule_core.subwords import SubwordVectors
from mule.mule_core.training.average import ema_weight
from mule.mule_core.training.joint import JointTrainer
from mule.mule_core.training.lp import LPTrainer
from mule.mule_core.training.row_updates import RowAdam, RowAverage, clip_grad_norm, coalesced, ema_keep, sparse_tables
from tests.test_training import LOSS, lp, optim, toy_model, toy_split


def sparse_grad(rows: list[int], values: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
    return torch.sparse_coo_tensor(torch.tensor([rows]), values, shape, check_invariants=True)


def test_row_adam_steps_the_rows_a_batch_read_and_no_other():
    """Adam's first step is lr * g / (|g| + eps): about lr against the gradient's sign, on
    rows 1 and 4; the other rows and their moments stay as they were."""
    table = torch.nn.Parameter(torch.zeros(6, 2))
    optimizer = RowAdam([table], lr=0.1)
    table.grad = sparse_grad([1, 4], torch.tensor([[2.0, -3.0], [-0.5, 4.0]]), (6, 2))
    optimizer.step()
    expected = torch.zeros(6, 2)
    expected[1] = torch.tensor([-0.1, 0.1])
    expected[4] = torch.tensor([0.1, -0.1])
    assert torch.allclose(table.detach(), expected, atol=1e-6)
    moments = optimizer.state[table]["exp_avg"]
    assert torch.count_nonzero(moments[[0, 2, 3, 5]]) == 0
    # a second batch that reads row 2 alone: rows 1 and 4 keep their value (dense Adam's
    # momentum would move them again)
    table.grad = sparse_grad([2], torch.tensor([[1.0, 1.0]]), (6, 2))
    optimizer.step()
    assert torch.allclose(table.detach()[[1, 4]], expected[[1, 4]], atol=1e-6)
    assert (table.detach()[2] < 0).all()


def test_row_adam_is_adam_when_every_row_is_read():
    torch.manual_seed(0)
    start = torch.randn(5, 3)
    rows, dense = torch.nn.Parameter(start.clone()), torch.nn.Parameter(start.clone())
    bias_rows, bias_dense = torch.nn.Parameter(torch.zeros(3)), torch.nn.Parameter(torch.zeros(3))
    mine = RowAdam([{"params": [bias_rows]}, {"params": [rows], "lr": 0.05}], lr=0.01)
    theirs = torch.optim.Adam([{"params": [bias_dense]}, {"params": [dense], "lr": 0.05}], lr=0.01, foreach=False)
    for _ in range(5):
        grad, bias_grad = torch.randn(5, 3), torch.randn(3)
        rows.grad, dense.grad = sparse_grad(list(range(5)), grad, (5, 3)), grad
        bias_rows.grad, bias_dense.grad = bias_grad.clone(), bias_grad.clone()
        mine.step()
        theirs.step()
    assert torch.allclose(rows.detach(), dense.detach(), atol=1e-6)
    assert torch.allclose(bias_rows.detach(), bias_dense.detach(), atol=1e-6)
    assert mine.state_dict()["state"][1].keys() == theirs.state_dict()["state"][1].keys()  # one checkpoint layout


def test_a_row_read_twice_counts_once_in_the_gradient_norm():
    """A word read by its sentence and by its L2 pull gives row 1 twice; the gradient is
    their sum (3, 4): norm 5, clipped to 1 as the dense gradient would be."""
    table = torch.nn.Parameter(torch.zeros(3, 2))
    dense = torch.nn.Parameter(torch.zeros(3, 2))
    table.grad = sparse_grad([1, 1], torch.tensor([[1.0, 1.0], [2.0, 3.0]]), (3, 2))
    dense.grad = table.grad.to_dense()
    coalesced([table])
    assert table.grad.is_coalesced() and table.grad._nnz() == 1
    assert float(clip_grad_norm([table], 1.0)) == pytest.approx(5.0)
    assert float(torch.nn.utils.clip_grad_norm_([dense], 1.0)) == pytest.approx(5.0)
    assert torch.allclose(table.grad.to_dense(), dense.grad, atol=1e-6)
    assert torch.allclose(table.grad.to_dense()[1], torch.tensor([0.6, 0.8]), atol=1e-6)


@pytest.mark.parametrize("max_norm", [6.0, 5.0, 1.0, 5.0 - 1e-7])
def test_dense_gradients_are_clipped_as_torch_clips_them_and_left_alone_under_the_norm(max_norm):
    """Gradients of norm 5: clipped to max_norm as torch's clip_grad_norm_ clips them, to the
    bit; under it (torch multiplies by 1.0) not written at all: an LP step's pass over every
    table for nothing."""
    grads = [torch.tensor([[3.0, 0.0], [0.0, 0.0]]), torch.tensor([4.0])]
    mine = [torch.nn.Parameter(torch.zeros_like(g)) for g in grads]
    theirs = [torch.nn.Parameter(torch.zeros_like(g)) for g in grads]
    for m, t, g in zip(mine, theirs, grads):
        m.grad, t.grad = g.clone(), g.clone()
    versions = [m.grad._version for m in mine]
    assert torch.equal(clip_grad_norm(mine, max_norm), torch.nn.utils.clip_grad_norm_(theirs, max_norm))
    for m, t in zip(mine, theirs):
        assert torch.equal(m.grad, t.grad)
    scaled = max_norm / (5.0 + 1e-6) < 1.0
    assert [m.grad._version != v for m, v in zip(mine, versions)] == [scaled, scaled]


def test_norms_known_from_the_rows_spare_the_pass_under_the_norm_and_clip_exactly_over_it():
    """A table whose gradient's norm is known (3, from the rows its batch read) and a bias of
    norm 4: under max_norm 6 nothing is read or scaled (the table's gradient here holds
    other numbers, to show it is not read); over max_norm 1 the norm is taken over every
    gradient, and clipping is torch's, to the bit."""
    table, bias = torch.nn.Parameter(torch.zeros(4, 2)), torch.nn.Parameter(torch.zeros(2))
    table.grad, bias.grad = torch.full((4, 2), 10.0), torch.tensor([4.0, 0.0])
    known = {id(table): torch.tensor(3.0)}
    assert float(clip_grad_norm([table, bias], 6.0, known)) == pytest.approx(5.0)
    assert torch.equal(table.grad, torch.full((4, 2), 10.0)) and torch.equal(bias.grad, torch.tensor([4.0, 0.0]))
    table.grad = torch.tensor([[3.0, 0.0], [0.0, 0.0], [0.0, 0.0], [0.0, 0.0]])
    theirs = [torch.nn.Parameter(torch.zeros(4, 2)), torch.nn.Parameter(torch.zeros(2))]
    theirs[0].grad, theirs[1].grad = table.grad.clone(), bias.grad.clone()
    assert torch.equal(clip_grad_norm([table, bias], 1.0, known), torch.nn.utils.clip_grad_norm_(theirs, 1.0))
    assert torch.equal(table.grad, theirs[0].grad) and torch.equal(bias.grad, theirs[1].grad)


def test_a_gradient_that_is_not_a_number_is_clipped_as_torch_clips_it():
    mine, theirs = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(2))
    mine.grad, theirs.grad = torch.tensor([float("nan"), 1.0]), torch.tensor([float("nan"), 1.0])
    clip_grad_norm([mine], 1.0), torch.nn.utils.clip_grad_norm_([theirs], 1.0)
    assert torch.equal(mine.grad.isnan(), theirs.grad.isnan()) and mine.grad.isnan().all()


def test_what_is_left_of_an_average_over_the_steps_a_row_sat_still():
    """d = 0.5: steps 2 and 3 keep (1 - 2/3) (1 - 4/7) = 1/7 of the average's distance from the
    weights; a row never averaged (since 0) keeps nothing (step 1's weight is 1)."""
    assert float(ema_keep(0.5, torch.tensor([1]), 3)) == pytest.approx(1 / 7)
    assert float(ema_keep(0.5, torch.tensor([1]), 3)) == pytest.approx((1 - ema_weight(0.5, 2)) * (1 - ema_weight(0.5, 3)))
    assert float(ema_keep(0.5, torch.tensor([0]), 4)) == 0.0
    assert float(ema_keep(0.99, torch.tensor([7]), 7)) == 1.0


def test_a_row_by_row_average_is_the_step_by_step_average():
    """Rows move only in some steps; the average kept row by row (caught up before a row
    moves, settled before it is read) equals every row's average taken at every step."""
    torch.manual_seed(1)
    decay = 0.9
    current = torch.randn(8, 4)
    stepwise, rowwise = current.clone(), current.clone()
    average = RowAverage(rowwise, current, decay, 0)
    for step in range(1, 31):
        moved = torch.randperm(8)[: int(torch.randint(0, 4, ()))].sort().values
        average.catch_up(moved, step - 1)
        current.index_add_(0, moved, torch.randn(len(moved), 4))
        weight = ema_weight(decay, step)
        stepwise.lerp_(current, weight)
        average.lerp(moved, weight, step)
        if step % 10 == 0:  # an epoch's end: validation reads every row
            average.settle(step)
            assert torch.allclose(rowwise, stepwise, atol=1e-5), step


@pytest.mark.slow
def test_sparse_ngram_sums_are_the_bags_sums_and_read_each_ngram_once():
    words = ["<pad>", "<unk>", "dog", "dogs", "god", "doge"]
    torch.manual_seed(0)
    bags = SubwordVectors(words, 4, (3,))
    torch.nn.init.normal_(bags.vectors.weight)
    rows = bags.index[torch.tensor([2, 3, 5])]
    dense = bags.sums(rows)
    dense.sum().backward()
    dense_grad = bags.vectors.weight.grad.clone()
    bags.vectors.weight.grad = None
    bags.vectors.sparse = True
    sparse = bags.sums(rows)
    sparse.sum().backward()
    assert torch.equal(sparse, dense)
    grad = bags.vectors.weight.grad
    assert grad.is_sparse and len(set(grad._indices()[0].tolist())) == grad._nnz()  # each n-gram once
    assert torch.allclose(grad.to_dense(), dense_grad)


def test_lp_with_row_updates_leaves_a_word_no_caption_uses_as_it_was_and_averages_the_rest():
    """word25 (a vocabulary row no training caption reads) keeps its vector and its average;
    read rows move; the model trains as well as with dense updates."""
    data = toy_split()
    results = {}
    for updates in ("rows", "dense"):
        model = toy_model(n_images=26)  # two words more than the 24 images' captions use
        start = model.branches["en"].embed.weight.detach().clone()
        train = replace(optim(2), ema=0.99, word_updates=updates, grad_clip=2.0)
        trainer = LPTrainer(model, data, LOSS, train, torch.device("cpu"), pretrain=lp(2))
        assert all(t.grad is None for t in trainer.updates.tables)
        trainer.fit()
        after = model.branches["en"].embed.weight.detach()
        results[updates] = trainer.history[-1].losses["nc_mule"]
        if updates == "rows":
            assert trainer.updates.tables and all(m.sparse for b in model.branches.values() for m in (b.embed, b.subwords.vectors))
            assert torch.equal(after[[26, 27]], start[[26, 27]])  # word24, word25: no caption says them
            assert torch.equal(trainer.average.model.branches["en"].embed.weight[[26, 27]], start[[26, 27]])
            assert not torch.allclose(after[2:26], start[2:26])
    assert results["rows"] == pytest.approx(results["dense"], abs=0.1)


def test_dense_updates_give_dense_gradients_again():
    model = toy_model()
    assert sparse_tables(model, True)
    trainer = JointTrainer(model, toy_split(), LOSS, replace(optim(1), word_updates="dense"), torch.device("cpu"))
    trainer.run_epoch()  # the tables read their rows sparse, and step on dense gradients (mule_core/training/dense_tables.py)
    tables = [t for b in model.branches.values() for t in (b.embed.weight, b.subwords.vectors.weight)]
    assert all(t.grad is not None and not t.grad.is_sparse for t in tables)
    assert type(trainer.optimizer) is torch.optim.Adam


def test_word_updates_names_rows_or_dense():
    from mule.config.resolution import resolve
    from mule.mule_core.settings import ConfigError

    with pytest.raises(ConfigError, match="train.word_updates must be rows or dense"):
        resolve(None, {"train.word_updates": "lazy"})
