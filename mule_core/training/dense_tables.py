"""Dense updates of the word and n-gram tables (train.word_updates=dense) with gradients
built by hand: the numbers autograd built, in a few passes over each table.

Every step Adam reads a gradient of every row of each table (dense updates), and the L2
pull toward the initial word vectors, loss.word_l2 * sum ||W - W0||^2, has the gradient
2 * word_l2 * (W - W0) on every row. Through autograd one LP step on the real Multi30K text
made about ten passes over each word table (the difference, its square and their
backward, the embedding's zero-filled gradient in new memory, the sum of the two) and two
over each n-gram table, allocating and freeing 85 M parameters' worth of gradients. Here
the tables give the rows a batch read (sparse gradients, as train.word_updates=rows reads
them), and each table's dense gradient is a buffer kept between steps: the pull's
gradient (the difference taken for the loss's value, scaled) or zeros, with the rows read
added. The same float32 products and sums as autograd's, so the same weights step after
step (`tests/test_dense_tables.py`: to the bit on the toy model); a row read twice in a
batch could be summed in another order.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn


class DenseTables:
    def __init__(self, branches: Iterable[nn.Module], pull: float):
        branches = list(branches)
        self.pull = pull
        # float32's rounding of the weight, as autograd multiplies by it (times 2: exact)
        self.scale = 2.0 * float(torch.tensor(pull, dtype=torch.float32))
        self.words = [(b.embed, b.initial) for b in branches if b.embed.weight.requires_grad]
        self.ngrams = [b.subwords.vectors for b in branches
                       if b.subwords is not None and b.subwords.vectors.weight.requires_grad]  # fmt: skip
        # a frozen table's drift is a constant of the loss (a language added to a trained
        # model), taken at the first step (after a checkpoint's weights were loaded)
        self.frozen_words = [(b.embed, b.initial) for b in branches if not b.embed.weight.requires_grad]
        self.frozen: torch.Tensor | None = None
        for module in [embed for embed, _ in self.words] + self.ngrams:
            module.sparse = True  # the rows read: added to the dense gradient by `gradients`
        self.buffers = {id(m.weight): torch.zeros_like(m.weight, requires_grad=False)
                        for m in [embed for embed, _ in self.words] + self.ngrams}  # fmt: skip
        # an n-gram buffer is zero but for the rows the last batch read: those are zeroed
        # again, not the whole table (clipping and AMP's unscaling only scale its rows)
        self.last_rows: dict[int, torch.Tensor] = {}
        self.pulled = False
        self.squares: dict[int, torch.Tensor] = {}  # a word table's sum of (W - W0)^2, as pull_loss took it
        # each table's gradient norm, from the rows the batch read (`gradients`): clipping's
        # norm without a pass over every row (row_updates.clip_grad_norm, `known`)
        self.norms: dict[int, torch.Tensor] = {}

    @torch.no_grad()
    def reset(self) -> None:
        """Every buffer zero again. The n-gram buffers are zeroed only on the rows the last
        batch read, so a step whose gradients were not finite must call this: clipping by a
        norm that is not a number, or AMP's unscaling of an overflow, leaves NaN or inf on
        every row, and they would stay there, step after step (the optimiser then skips
        every step under AMP, or rolls back into NaN again). Also after weights are loaded."""
        for buffer in self.buffers.values():
            buffer.zero_()
        self.last_rows.clear()
        self.pulled = False

    def __bool__(self) -> bool:
        return bool(self.words or self.ngrams)

    @torch.no_grad()
    def pull_loss(self) -> torch.Tensor | None:
        """loss.word_l2 * sum ||W - W0||^2 at this step's weights, None without a pull (a
        value: its gradient is added by `gradients`, after the backward pass)."""
        if self.pull <= 0 or not self.words:
            return None
        total = None
        for embed, initial in self.words:
            difference = self.buffers[id(embed.weight)]
            torch.sub(embed.weight, initial, out=difference)
            flat = difference.view(-1)
            squares = torch.dot(flat, flat)
            self.squares[id(embed.weight)] = squares
            total = squares if total is None else total + squares
        if self.frozen_words:
            if self.frozen is None:
                self.frozen = sum((embed.weight - initial).pow(2).sum() for embed, initial in self.frozen_words)
            total = total + self.frozen
        self.pulled = True
        return self.pull * total

    @torch.no_grad()
    def gradients(self, loss_scale: float = 1.0) -> None:
        """Each table's dense gradient: the pull's (words) or zeros (n-grams), plus the rows
        the batch read. `loss_scale`: the AMP scaler's (autograd's gradients carry it). Call
        after backward, before clipping and the step.

        Each table's gradient norm comes with it (`norms`), from the rows read: the n-gram
        gradient is zero elsewhere, and the word gradient is the pull's there, whose squares
        pull_loss summed. The same norm as a pass over the table, to float32's rounding."""
        self.norms = {}
        for embed, _ in self.words:
            buffer = self.buffers[id(embed.weight)]
            if self.pulled:
                scale = self.scale * loss_scale
                buffer.mul_(scale)
                pulled = self.squares[id(embed.weight)] * (scale * scale)
            elif embed.weight.grad is None:
                continue  # not read, not pulled: no gradient, as autograd gives none (Adam skips the table)
            else:
                buffer.zero_()
                pulled = None
            self._add_rows(embed.weight, buffer, pulled)
        for vectors in self.ngrams:
            if vectors.weight.grad is None:
                continue  # a batch without the language: no gradient, no Adam step for the table
            buffer = self.buffers[id(vectors.weight)]
            last = self.last_rows.pop(id(vectors.weight), None)
            if last is not None:
                buffer.index_fill_(0, last, 0.0)
            self.last_rows[id(vectors.weight)] = self._add_rows(vectors.weight, buffer)
        self.pulled = False

    def _add_rows(self, table: nn.Parameter, buffer: torch.Tensor, pulled: torch.Tensor | None = None):
        """Adds the rows the batch read to `buffer`, which becomes the table's gradient, and
        notes its norm (`pulled`: the sum of squares of the buffer before, None when it was
        zero); the rows."""
        read, rows = table.grad, None
        squares = pulled if pulled is not None else torch.zeros((), dtype=buffer.dtype, device=buffer.device)
        if read is not None:
            read = read if read.is_sparse else read.to_sparse()
            rows = read._indices()[0]
            ordered = len(rows) < 2 or bool((rows[1:] > rows[:-1]).all())  # the distinct words and n-grams read
            distinct = rows if ordered else rows.unique()
            if pulled is not None:  # the rows' pull, counted in `pulled`, is replaced by what they hold next
                before = buffer.index_select(0, distinct).view(-1)
                squares = squares - torch.dot(before, before)
            buffer.index_add_(0, rows, read._values())
            after = buffer.index_select(0, distinct).view(-1)
            squares = squares + torch.dot(after, after)
        self.norms[id(table)] = squares.clamp(min=0.0).sqrt()
        table.grad = buffer
        return rows
