"""Losses over the most violated constraints in a minibatch.

Every loss here is a triplet loss on cosine similarities s (higher = closer):

    for each positive pair (a, p), and each of the k negatives n of a with the highest s(a, n):
        [margin - s(a, p) + s(a, n)]_+

averaged over the pairs and their k constraints. The k hardest negatives of an anchor
do not depend on the positive, so they are found once per anchor with one top-k.
Positives are never negatives: a candidate that shares the anchor's group (its image)
is masked out of the negatives, whatever its language. With `sentence_text` (an id per
distinct sentence), a sentence's words belong to every image that has a copy of them,
in both losses: a copy is never a negative of the sentences of any image it describes,
since it cannot be ranked below the sentence it copies; as a "negative" it only keeps a
loss floor no model can meet.
"""

from __future__ import annotations

import contextlib
import math

import torch
import torch.nn.functional as F

from mule.mule_core.grouping import group_slots


def triplet_topk(
    sim: torch.Tensor,
    positive: torch.Tensor,
    pairs: tuple[torch.Tensor, torch.Tensor],
    margin: float,
    k: int,
    rows: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """sim: A x C similarities; positive: A x C, True where a candidate is a positive of the
    anchor (or the anchor itself); pairs: (anchor rows, candidate columns) of the positive
    pairs to enforce. Returns the mean hinge over pairs x k hardest negatives, in float32
    whatever sim's type: under float16 autocast (train.amp) the gradient AMP's scaler sends
    into the loss (65,536 at first) would overflow a float16 loss (the largest is 65,504),
    and the scaler would skip the step.

    rows: the anchors' and candidates' embeddings (A x D, C x D) whose products sim holds.
    When mining (k < C), sim then only chooses: the similarities the loss reads (the pairs'
    and the k hardest per anchor) are computed again from the rows, so the backward pass
    is a few dot products per anchor instead of two A x C x D products through the whole
    matrix (most of a real-text LP step's loss, at 3,072 sentences)."""
    anchors, candidates = pairs
    if anchors.numel() == 0:
        return sim.new_zeros((), dtype=torch.float32)
    if rows is not None and k < sim.shape[1]:
        negatives = sim.detach().masked_fill(positive, float("-inf"))
        return _hinge_over_chosen_negatives(negatives, anchors, candidates, margin, k, *rows)
    negatives = sim.masked_fill(positive, float("-inf"))
    # index_select (its gradient is an index_add) rather than advanced indexing, whose
    # gradient is an accumulating index_put: several times slower on the CPU.
    positive_sim = sim.reshape(-1).index_select(0, anchors * sim.shape[1] + candidates)
    if k >= sim.shape[1]:  # the warm-up: every negative counts
        return _hinge_over_all_negatives(sim, negatives, anchors, positive_sim, margin)
    hardest = negatives.topk(k, dim=1).values  # A x k, -inf where too few negatives
    violation = (margin - positive_sim).unsqueeze(1) + hardest.index_select(0, anchors)
    return violation.clamp(min=0).mean(dtype=torch.float32)


def _hinge_over_chosen_negatives(negatives: torch.Tensor, anchors: torch.Tensor, candidates: torch.Tensor,
                                 margin: float, k: int, a: torch.Tensor, c: torch.Tensor) -> torch.Tensor:  # fmt: skip
    """triplet_topk's mined hinge: `negatives` (the similarities with positives at -inf, no
    gradient) choose each anchor's k hardest, the rows a, c give the chosen similarities
    their values and gradients."""
    with torch.no_grad():
        found = negatives.topk(k, dim=1)  # A x k
    positive_sim = (a.index_select(0, anchors) * c.index_select(0, candidates)).sum(1)
    chosen = c.index_select(0, found.indices.reshape(-1)).reshape(*found.indices.shape, -1)  # A x k x D
    hardest = torch.bmm(chosen, a.unsqueeze(2)).squeeze(2)  # A x k
    hardest = hardest.masked_fill(found.values == float("-inf"), float("-inf"))  # too few negatives
    violation = (margin - positive_sim).unsqueeze(1) + hardest.index_select(0, anchors)
    return violation.clamp(min=0).mean(dtype=torch.float32)


def _hinge_over_all_negatives(sim: torch.Tensor, negatives: torch.Tensor, anchors: torch.Tensor,
                              positive_sim: torch.Tensor, margin: float) -> torch.Tensor:  # fmt: skip
    """mean over pairs p and candidates c of [margin - s(p) + negatives[anchor(p), c]]_+,
    without the pairs x candidates matrix. With t(p) = s(p) - margin, the sum is

        sum over (a, c) of k(a, c) n(a, c)  -  sum over p of t(p) above(p)

    where k(a, c) counts anchor a's thresholds t below its negative n(a, c), and above(p)
    counts the negatives of p's anchor above t(p). An anchor has a dozen pairs, so k is one
    batched searchsorted of the A x C negatives among A x 12 sorted thresholds, and above
    a histogram of k: no sort of the A x C matrix (which was most of an LP warm-up step).
    Positives (-inf among the negatives) have k = 0 and count as zeros."""
    n_anchors, n_candidates = negatives.shape
    threshold = positive_sim - margin
    # Each anchor's thresholds in one row, padded with +inf (never below a negative).
    order, slot, width = group_slots(anchors, n_anchors)
    padded = threshold.new_full((n_anchors, width), float("inf")).index_put((anchors[order], slot), threshold[order])
    ascending = padded.sort(dim=1).values
    # A x C: thresholds strictly below; in int32 where the histogram's bins fit (at a real-text LP
    # batch this and the histogram took 190-210 ms a call in int64, 155 ms in int32)
    small = n_anchors * (width + 1) < 2**31
    k = torch.searchsorted(ascending.detach(), negatives.detach().contiguous(), out_int32=small)
    # the gradient reaching n(a, c) is k(a, c); rows summed in float32, their sum in float64
    violated = (k.to(sim.dtype) * sim).sum(1).sum(dtype=torch.float64)
    k += torch.arange(n_anchors, device=k.device, dtype=k.dtype)[:, None] * (width + 1)  # a bin per (anchor, k)
    histogram = torch.bincount(k.reshape(-1), minlength=n_anchors * (width + 1)).reshape(n_anchors, width + 1)
    above = histogram.flip(1).cumsum(1).flip(1)[:, 1:]  # above[a, j]: negatives with k > j, those above threshold j
    paid = (ascending.masked_fill(above == 0, 0) * above.to(sim.dtype)).sum(dtype=torch.float64)
    return ((violated - paid) / (len(anchors) * n_candidates)).float()


def image_sentence_loss(
    images: torch.Tensor,
    sentences: torch.Tensor,
    sentence_image: torch.Tensor,
    margin: float,
    k: int,
    sentence_text: torch.Tensor | None = None,
) -> torch.Tensor:
    """Bidirectional: image anchors against sentences, sentence anchors against images.

    images: I x D, sentences: S x D (both L2-normalised); sentence_image: S, the row of
    each sentence's image in `images`.
    """
    sim = images @ sentences.T  # I x S
    rows = torch.arange(images.shape[0], device=images.device)
    cols = torch.arange(sentences.shape[0], device=images.device)
    if sentence_text is None:
        positive = rows[:, None] == sentence_image[None, :]
    else:  # image i "owns" every copy of its own sentences
        owners = sentence_owners(sentence_image, sentence_text)
        positive = (rows[:, None, None] == owners[None]).any(-1)
    image_anchored = triplet_topk(sim, positive, (sentence_image, cols), margin, k, (images, sentences))
    sentence_anchored = triplet_topk(sim.T, positive.T, (cols, sentence_image), margin, k, (sentences, images))
    return image_anchored + sentence_anchored


def neighborhood_loss(
    sentences: torch.Tensor,
    sentence_image: torch.Tensor,
    pairs: tuple[torch.Tensor, torch.Tensor],
    margin: float,
    k: int,
    sentence_text: torch.Tensor | None = None,
) -> torch.Tensor:
    """Neighborhood constraints: sentences of the same image (any language) closer than
    sentences of other images. sentences: S x D, L2-normalised; pairs: same-image pairs
    (a != p) in both orders."""
    mined = k < len(sentences)
    with torch.no_grad() if mined else contextlib.nullcontext():  # mined: the matrix only chooses
        sim = sentences @ sentences.T
    if sentence_text is None:
        positive = sentence_image[:, None] == sentence_image[None, :]  # includes the anchor itself
    else:
        # A sentence's words belong to every image with a copy of them (as image_sentence_loss
        # has it): two sentences are no negatives of each other when some image owns both.
        # Sentences with the same owners have the same row: overlaps of the distinct owner
        # sets (a few hundred), then one gather per axis.
        owner_sets, set_of = distinct_rows(sentence_owners(sentence_image, sentence_text))
        shared = (owner_sets[:, None, :, None] == owner_sets[None, :, None, :]) & (owner_sets >= 0)[:, None, :, None]
        # columns first, on the few set rows; then whole rows (a copy each): a column gather
        # of the S x sets matrix was 28 ms of a real-text LP step
        positive = shared.flatten(2).any(2).index_select(1, set_of).index_select(0, set_of)
    if mined and pairs[0].numel():  # the matrix is this function's own: masked in place (a copy was 3% of an LP step)
        negatives = sim.masked_fill_(positive, float("-inf"))
        return _hinge_over_chosen_negatives(negatives, *pairs, margin, k, sentences, sentences)
    return triplet_topk(sim, positive, pairs, margin, k, (sentences, sentences))


def sentence_owners(sentence_image: torch.Tensor, sentence_text: torch.Tensor) -> torch.Tensor:
    """S x m: the images of the batch that have a copy of each sentence's words (its own
    among them), -1 where a sentence has fewer than m. Most sentences have one owner, so the
    masks built from this table are a few S x S comparisons, where S x S x I products were
    a fifth of an LP step."""
    n_images = int(sentence_image.max()) + 1
    _, text_of = torch.unique(sentence_text, return_inverse=True)  # ids 0..T-1, whatever the given ids
    pairs = torch.unique(text_of * n_images + sentence_image)  # distinct (text, image), sorted by text
    text, image = pairs.div(n_images, rounding_mode="floor"), pairs.remainder(n_images)
    rank = torch.arange(len(pairs), device=pairs.device) - torch.searchsorted(text, text)  # place among its text's
    table = torch.full((int(text_of.max()) + 1, int(rank.max()) + 1), -1, dtype=image.dtype, device=image.device)
    table[text, rank] = image
    return table.index_select(0, text_of)


def distinct_rows(table: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """torch.unique(table, dim=0, return_inverse=True) for a table of small integers >= -1
    (sentence_owners'): each row read as one number in base max + 2, first column most
    significant (the same sorted rows), and a 1-D unique of those. torch's unique over rows
    compares them one by one on the CPU (3,000 torch.equal calls at a real-text LP batch's
    3,072 sentences: 1.5 ms a step, 0.1 ms this way)."""
    rows, width = table.shape
    base = int(table.max()) + 2 if table.numel() else 1
    if rows == 0 or width * math.log2(max(base, 2)) > 62:  # the number would not fit in an int64
        return torch.unique(table, dim=0, return_inverse=True)
    digits = base ** torch.arange(width - 1, -1, -1, device=table.device, dtype=torch.int64)
    keys, inverse = torch.unique(((table.long() + 1) * digits).sum(1), return_inverse=True)
    first = torch.full((len(keys),), rows, dtype=torch.int64, device=table.device)
    first.scatter_reduce_(0, inverse, torch.arange(rows, device=table.device), "amin")
    return table.index_select(0, first), inverse


def language_classifier_loss(logits: torch.Tensor, language: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits, language)
