"""The losses, on cases small enough to compute by hand."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from mule.mule_core.losses import image_sentence_loss, neighborhood_loss, triplet_topk
from mule.mule_core.model import grad_reverse


def test_triplet_single_anchor_hand_computed():
    # One anchor, candidates: positive (0.8), negatives 0.5, 0.9, 0.1; margin 0.2.
    sim = torch.tensor([[0.8, 0.5, 0.9, 0.1]])
    positive = torch.tensor([[True, False, False, False]])
    pairs = (torch.tensor([0]), torch.tensor([0]))
    # violations: 0.2 - 0.8 + [0.9, 0.5, 0.1] = [0.3, -0.1, -0.5] -> [0.3, 0, 0]
    assert triplet_topk(sim, positive, pairs, margin=0.2, k=1).item() == pytest.approx(0.3)
    assert triplet_topk(sim, positive, pairs, margin=0.2, k=2).item() == pytest.approx(0.15)  # (0.3 + 0) / 2
    assert triplet_topk(sim, positive, pairs, margin=0.2, k=3).item() == pytest.approx(0.1)  # (0.3 + 0 + 0) / 3


def test_top_k_keeps_the_most_violated_constraints():
    # Margin 1: every negative violates; top-2 keeps the two most similar negatives (0.7, 0.6).
    sim = torch.tensor([[0.5, 0.7, 0.1, 0.6, -0.3]])
    positive = torch.tensor([[True, False, False, False, False]])
    pairs = (torch.tensor([0]), torch.tensor([0]))
    expected = ((1 - 0.5 + 0.7) + (1 - 0.5 + 0.6)) / 2
    assert triplet_topk(sim, positive, pairs, margin=1.0, k=2).item() == pytest.approx(expected)


def test_k_larger_than_the_negatives_counts_missing_ones_as_satisfied():
    sim = torch.tensor([[0.5, 0.7]])
    positive = torch.tensor([[True, False]])
    pairs = (torch.tensor([0]), torch.tensor([0]))
    # Only one negative: top-2 holds it and one masked slot that contributes 0.
    assert triplet_topk(sim, positive, pairs, margin=0.1, k=2).item() == pytest.approx((0.1 - 0.5 + 0.7) / 2)


def test_positives_are_never_negatives():
    # Two positives of the anchor with high similarity must not appear as negatives.
    sim = torch.tensor([[0.9, 0.95, 0.2]])
    positive = torch.tensor([[True, True, False]])
    pairs = (torch.tensor([0, 0]), torch.tensor([0, 1]))
    # Only candidate 2 is a negative: pair (0,0): 0.1 - 0.9 + 0.2 < 0; pair (0,1): < 0.
    assert triplet_topk(sim, positive, pairs, margin=0.1, k=2).item() == 0.0


def test_image_sentence_loss_both_directions():
    # Two images, two sentences (sentence i belongs to image i), unit vectors in 2-D.
    images = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    s = 2**-0.5
    sentences = torch.tensor([[s, s], [0.0, 1.0]])
    sentence_image = torch.tensor([0, 1])
    # sim = images @ sentences.T = [[s, 0], [s, 1]]
    # image anchors: img0 pos s, neg 0 -> [0.5 - s + 0]+ = 0; img1 pos 1, neg s -> [0.5 - 1 + s]+ = s - 0.5
    # sentence anchors: sent0 pos s (img0), neg s (img1) -> 0.5; sent1 pos 1, neg 0 -> 0
    expected = (0 + (s - 0.5)) / 2 + (0.5 + 0) / 2
    loss = image_sentence_loss(images, sentences, sentence_image, margin=0.5, k=1)
    assert loss.item() == pytest.approx(expected, abs=1e-6)


def test_neighborhood_loss_uses_same_image_sentences_as_positives():
    # Sentences 0 and 1 describe image 0, sentence 2 image 1.
    sentences = torch.nn.functional.normalize(torch.tensor([[1.0, 0.0], [1.0, 0.1], [0.0, 1.0]]), dim=-1)
    sentence_image = torch.tensor([0, 0, 1])
    pairs = (torch.tensor([0, 1]), torch.tensor([1, 0]))
    assert neighborhood_loss(sentences, sentence_image, pairs, margin=0.1, k=1).item() == 0.0
    # Swap roles: now the same-image sentences are far apart and a negative is close.
    far = torch.nn.functional.normalize(torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 0.05]]), dim=-1)
    assert neighborhood_loss(far, sentence_image, pairs, margin=0.1, k=1).item() > 0.5


def test_gradient_reversal_flips_and_scales_the_gradient():
    x = torch.tensor([1.0, -2.0], requires_grad=True)
    y = grad_reverse(x, scale=0.5)
    assert torch.equal(y, x)  # identity forward
    (y * torch.tensor([3.0, 4.0])).sum().backward()
    assert torch.equal(x.grad, torch.tensor([-1.5, -2.0]))


def test_the_loss_gradient_pulls_the_positive_closer():
    sim = torch.tensor([[0.2, 0.4]], requires_grad=True)
    positive = torch.tensor([[True, False]])
    triplet_topk(sim, positive, (torch.tensor([0]), torch.tensor([0])), margin=0.5, k=1).backward()
    assert sim.grad[0, 0] < 0 < sim.grad[0, 1]  # descent raises s(a,p) and lowers s(a,n)


def test_a_copy_of_one_of_the_anchors_sentences_is_no_negative():
    """Image 0's sentence and image 1's are the same words. With every embedding equal, each
    direction of the image-sentence loss costs the margin per constraint; once the copies are
    known (sentence_text), neither image has a negative left: nothing to pay."""
    e = torch.nn.functional.normalize(torch.ones(2, 4), dim=-1)
    owner = torch.tensor([0, 1])
    assert image_sentence_loss(e, e, owner, 0.2, 1).item() == pytest.approx(0.4)
    assert image_sentence_loss(e, e, owner, 0.2, 1, sentence_text=torch.tensor([7, 7])).item() == 0.0
    assert image_sentence_loss(e, e, owner, 0.2, 1, sentence_text=torch.tensor([7, 8])).item() == pytest.approx(0.4)


def test_neighborhood_constraints_skip_copies_of_any_sentence_of_the_anchors_image():
    """s0, s1 describe image 0; s2 (image 1) repeats s0 word for word. Unmasked, each anchor
    pays the margin (every embedding equal). Anchor s0 has no negative left (s2 is its
    copy); nor has anchor s1: "s1 nearer s0 than s2" cannot hold when s2 is s0, so s2 is
    masked for every sentence of image 0, as the image-sentence loss masks it: zero."""
    e = torch.nn.functional.normalize(torch.ones(3, 4), dim=-1)
    image = torch.tensor([0, 0, 1])
    pairs = (torch.tensor([0, 1]), torch.tensor([1, 0]))
    assert neighborhood_loss(e, image, pairs, 0.2, 1).item() == pytest.approx(0.2)
    assert neighborhood_loss(e, image, pairs, 0.2, 1, sentence_text=torch.tensor([5, 6, 5])).item() == 0.0
    assert neighborhood_loss(e, image, pairs, 0.2, 1, sentence_text=torch.tensor([5, 6, 7])).item() == pytest.approx(0.2)


def test_with_a_copied_caption_nc_and_the_image_sentence_loss_both_reach_zero():
    """Image 0: s0 (words 10), s1; image 1: s2 (words 10 again: a copy of s0), s3. The copy
    has s0's vector x; s1 and s3 lean towards x each its own way (a = x + e2, b = x + e3).
    Unmasked, anchor s0 must be nearer a than b and, as s2, nearer b than a: a floor no
    model meets. Words 10 belong to both images, so s0/s2 have no negatives, and
    s1 (resp. s3) only needs x nearer than b (a): 0.707 - 0.5 > 0.2. Both losses are zero,
    with images x + e2 - e3 and x + e3 - e2 (hand-checked: every margin met)."""
    e = torch.eye(4)
    unit = torch.nn.functional.normalize
    x, a, b = e[0], unit(e[0] + e[1], dim=0), unit(e[0] + e[2], dim=0)
    sentences = torch.stack([x, a, x, b])
    images = unit(torch.stack([e[0] + e[1] - e[2], e[0] + e[2] - e[1]]), dim=1)
    owner, text = torch.tensor([0, 0, 1, 1]), torch.tensor([10, 11, 10, 12])
    pairs = (torch.tensor([0, 1, 2, 3]), torch.tensor([1, 0, 3, 2]))
    assert neighborhood_loss(sentences, owner, pairs, 0.2, 2).item() > 0.05
    assert neighborhood_loss(sentences, owner, pairs, 0.2, 2, sentence_text=text).item() == 0.0
    assert image_sentence_loss(images, sentences, owner, 0.2, 2).item() > 0.05
    assert image_sentence_loss(images, sentences, owner, 0.2, 2, sentence_text=text).item() == 0.0


def test_duplicate_ids_are_per_language_and_exact_words():
    from mule.mule_core.batching import duplicate_ids

    tokens = torch.tensor([[4, 5, 0], [4, 5, 0], [4, 5, 6], [4, 5, 0]])
    ids = duplicate_ids(tokens, torch.tensor([2, 2, 3, 2]), np.array([0, 0, 0, 1]))
    assert ids[0] == ids[1] and len({ids[0], ids[2], ids[3]}) == 3  # the same ids in another language differ


def test_duplicate_ids_stay_exact_when_different_sentences_hash_alike(monkeypatch):
    """The rows' hash is checked: sentences that collide (here every hash is 0) still get
    ids of their own, equal exactly where the words are."""
    from mule.mule_core import batching

    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(2, 6, (200, 4), generator=generator)
    lengths, lang = torch.full((200,), 4), np.zeros(200, dtype=np.int64)
    expected = batching.duplicate_ids(tokens, lengths, lang)
    monkeypatch.setattr(batching.np.random, "default_rng", lambda seed: SimpleNamespace(integers=lambda *a, size, **k: np.zeros(size, dtype=np.int64)))
    collided = batching.duplicate_ids(tokens, lengths, lang)
    same = lambda ids: ids[:, None] == ids[None, :]  # noqa: E731
    words_equal = (tokens[:, None, :] == tokens[None, :, :]).all(-1).numpy()
    assert (same(expected) == words_equal).all() and (same(collided) == words_equal).all()
    assert len(set(collided.tolist())) == len(set(expected.tolist()))  # one class per distinct sentence, hash or not


@pytest.mark.parametrize("margin", [0.1, 0.4, 3.0])
@pytest.mark.parametrize("sizes", [[4] * 7, [3, 2, 5, 1, 2, 6]], ids=["even", "uneven"])
def test_the_warm_up_over_every_negative_is_the_hinge_mean_over_pairs_and_candidates(margin, sizes):
    """k covering every candidate takes the path that counts thresholds below each negative:
    it must give what the definition says, [margin - s(a, p) + s(a, n)]_+ averaged over
    pairs x candidates (positives count as zeros), value and gradient, whatever the number of
    sentences per image (one alone has no pair)."""
    torch.manual_seed(0)
    group = torch.arange(len(sizes)).repeat_interleave(torch.tensor(sizes))
    x = torch.nn.functional.normalize(torch.randn(len(group), 5), dim=1).requires_grad_()
    positive = group[:, None] == group[None, :]
    a, p = torch.nonzero(positive & ~torch.eye(len(group), dtype=torch.bool), as_tuple=True)

    fast = triplet_topk(x @ x.T, positive, (a, p), margin, k=len(group))
    (fast_grad,) = torch.autograd.grad(fast, x)
    sim = x @ x.T
    by_definition = ((margin - sim[a, p]).unsqueeze(1) + sim.masked_fill(positive, float("-inf"))[a]).clamp(min=0).mean()
    (definition_grad,) = torch.autograd.grad(by_definition, x)
    torch.testing.assert_close(fast, by_definition)
    torch.testing.assert_close(fast_grad, definition_grad)


def test_sentence_owners_lists_every_image_with_a_copy_of_the_words():
    """Sentences 0 and 3 are one text, of images 0 and 2; sentence 4 copies them on image 1;
    sentence 1 and 2 are texts of their own. Owners are padded with -1."""
    from mule.mule_core.losses import sentence_owners

    image = torch.tensor([0, 0, 1, 2, 1])
    text = torch.tensor([9, 4, 6, 9, 9])
    assert sentence_owners(image, text).tolist() == [[0, 1, 2], [0, -1, -1], [1, -1, -1], [0, 1, 2], [0, 1, 2]]


def test_the_negatives_masks_are_what_the_owner_sets_say():
    """Two sentences are no negatives of each other when some image owns both (NC), and an
    image owns each copy of its sentences (image-sentence loss): checked pair by pair against
    the definition, on batches with texts copied on up to four images."""
    import mule.mule_core.losses as losses

    seen = []

    def spy(sim, positive, pairs, margin, k, rows=None):
        seen.append(positive.clone())
        return sim.sum()

    generator = torch.Generator().manual_seed(3)
    for _ in range(20):
        n_images, n_sentences = 6, 30
        image = torch.randint(0, n_images, (n_sentences,), generator=generator)
        text = torch.randint(0, 12, (n_sentences,), generator=generator) * 1_000_003
        owners = [{int(image[j]) for j in range(n_sentences) if text[j] == text[i]} for i in range(n_sentences)]
        seen.clear()
        original, losses.triplet_topk = losses.triplet_topk, spy
        try:
            e = torch.randn(n_sentences, 4)
            none = torch.zeros(0, dtype=torch.long)
            losses.neighborhood_loss(e, image, (none, none), 0.2, 1, text)
            losses.image_sentence_loss(torch.randn(n_images, 4), e, image, 0.2, 1, text)
        finally:
            losses.triplet_topk = original
        nc, image_anchored = seen[0], seen[1]
        assert nc.tolist() == [[bool(owners[a] & owners[b]) for b in range(n_sentences)] for a in range(n_sentences)]
        assert image_anchored.tolist() == [[i in owners[s] for s in range(n_sentences)] for i in range(n_images)]


@pytest.mark.parametrize("k", [1, 3, 7])
def test_mined_loss_from_the_rows_equals_the_loss_through_the_whole_matrix(k):
    """With the embeddings given, the similarity matrix only chooses the k hardest negatives
    and their similarities are computed again from the rows: the same loss and gradients as
    through the matrix, in both losses, with copies masked and with anchors that have fewer
    than k negatives (image 3's sentences: 7 - 1 candidates, most of them positives)."""
    torch.manual_seed(0)
    images = torch.nn.functional.normalize(torch.randn(4, 6), dim=-1)
    sentences = torch.nn.functional.normalize(torch.randn(9, 6), dim=-1)
    image = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3, 3])
    text = torch.tensor([0, 1, 2, 3, 0, 4, 5, 6, 7])  # sentence 4 copies sentence 0
    pairs = (torch.tensor([0, 1, 2, 3, 6, 7, 8, 6]), torch.tensor([1, 0, 3, 2, 7, 8, 6, 8]))

    import mule.mule_core.losses as losses

    def through_the_matrix(fn, *args):  # the chosen negatives' hinge computed on a matrix that carries the gradient
        original = losses._hinge_over_chosen_negatives

        def on_the_matrix(negatives, anchors, candidates, margin, k, a, c):
            return losses.triplet_topk(a @ c.T, negatives.isneginf(), (anchors, candidates), margin, k)

        losses._hinge_over_chosen_negatives = on_the_matrix
        try:
            return fn(*args)
        finally:
            losses._hinge_over_chosen_negatives = original

    for fn, embeddings, rest in ((neighborhood_loss, (sentences,), (image, pairs, 0.3, k, text)),
                                 (image_sentence_loss, (images, sentences), (image, 0.3, k, text))):  # fmt: skip
        results = []
        for run in (fn, lambda *a, fn=fn: through_the_matrix(fn, *a)):
            leaves = [t.clone().requires_grad_() for t in embeddings]
            loss = run(*leaves, *rest)
            loss.backward()
            results.append((loss.detach(), [t.grad for t in leaves]))
        (rows_loss, rows_grads), (matrix_loss, matrix_grads) = results
        assert rows_loss > 0
        torch.testing.assert_close(rows_loss, matrix_loss)
        for mine, theirs in zip(rows_grads, matrix_grads):
            assert theirs.abs().sum() > 0
            torch.testing.assert_close(mine, theirs)


@pytest.mark.parametrize("shape, high", [((300, 3), 40), ((50, 1), 2), ((7, 4), 1000), ((20, 8), 300), ((0, 2), 5)])
def test_distinct_rows_are_torch_s_unique_rows(shape, high):
    """The owner sets by one number per row give what torch.unique(dim=0) gives: the same
    sorted rows and each row's place among them; (20, 8) with values to 300 does not fit an
    int64 and takes torch's path."""
    from mule.mule_core.losses import distinct_rows

    generator = torch.Generator().manual_seed(sum(shape) + high)
    table = torch.randint(-1, high, shape, generator=generator)
    if len(table) > 10:
        table[5:10] = table[0]  # repeated rows
    rows, inverse = distinct_rows(table)
    expected_rows, expected_inverse = torch.unique(table, dim=0, return_inverse=True)
    assert torch.equal(rows, expected_rows) and torch.equal(inverse, expected_inverse)
