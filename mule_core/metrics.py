"""Retrieval metrics, VSE++-style, with ties counted against the model.

image -> sentence: an image's queries hit at K if any of its sentences is among the K
    highest-scoring sentences; its rank is the number of *other images'* sentences
    scoring at least as high as its best sentence.
sentence -> image: one query per sentence; its rank is the number of other images
    scoring at least as high as its own image.
R@K = 100 * fraction of queries with rank < K. mR = mean of the six recalls.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

from mule.mule_core.grouping import group_slots

KS = (1, 5, 10)
# The recalls' definition above, as a name: two mRs compare only under the same one (and Ks)
PROTOCOL = "VSE++ R@K both directions, ties against the model"


def measure_of(ks: Iterable[int]) -> str:
    """What an mR over `ks` measures, as a string to compare: 'mean of R@1,5,10 (protocol)'."""
    return f"mean of R@{','.join(str(k) for k in sorted(set(ks)))} ({PROTOCOL})"


def grouped_ranks(
    sim: torch.Tensor, query_group: torch.Tensor, candidate_group: torch.Tensor, chunk: int = 4096
) -> torch.Tensor:
    """Rank of each query's best positive: how many candidates of *other* groups score at
    least as high as the best candidate of its own group. sim: Q x C. A query with no
    candidate of its group ranks behind every candidate (C).

    Its own group's candidates are gathered (a group holds a few: an image's captions), so
    the Q x C matrix is read once, by one comparison: the candidates at least as high as
    the best positive, less the positives among them. The same integers as masking the
    matrix by group (tests/test_metrics.py), in a third of the time."""
    n_candidates = sim.shape[1]
    if n_candidates == 0:
        return torch.zeros(sim.shape[0], dtype=torch.long, device=sim.device)
    groups, group_of = torch.unique(candidate_group, return_inverse=True)
    members = _members(group_of, groups.numel())  # (groups + 1) x largest group, -1 padded; last row empty
    row = torch.searchsorted(groups, query_group).clamp(max=groups.numel() - 1)
    own = members[torch.where(groups[row] == query_group, row, groups.numel())]
    positive = sim.gather(1, own.clamp(min=0)).masked_fill(own < 0, float("-inf"))
    best = positive.max(1).values
    ranks = -((positive >= best[:, None]) & (own >= 0)).sum(1)
    for start in range(0, n_candidates, chunk):
        at_least = sim[:, start : start + chunk] >= best[:, None]
        ranks += at_least.view(torch.uint8).sum(1, dtype=torch.int32)  # bytes summed: faster than bools
    return ranks


def _members(group_of: torch.Tensor, n_groups: int) -> torch.Tensor:
    """Row g: the candidates of group g (in order), padded with -1; one more row, empty."""
    order, slot, width = group_slots(group_of, n_groups)
    members = torch.full((n_groups + 1, width), -1, dtype=torch.long, device=group_of.device)
    members[group_of[order], slot] = order
    return members


def image_to_sentence_ranks(sim: torch.Tensor, sentence_image: torch.Tensor) -> torch.Tensor:
    """sim: I x S; sentence_image: S, image row of each sentence. Returns I ranks (0 = top)."""
    return grouped_ranks(sim, torch.arange(sim.shape[0], device=sim.device), sentence_image)


def sentence_to_image_ranks(sim: torch.Tensor, sentence_image: torch.Tensor) -> torch.Tensor:
    """sim: I x S. Returns S ranks (0 = its image is first)."""
    target = sim[sentence_image, torch.arange(sim.shape[1], device=sim.device)]
    return (sim >= target[None, :]).view(torch.uint8).sum(0, dtype=torch.int32).long() - 1


def recall_from_ranks(ranks: torch.Tensor, ks: Sequence[int] = KS) -> dict[int, float]:
    return {k: 100.0 * (ranks < k).float().mean().item() for k in ks}


def retrieval_recalls(sim: torch.Tensor, sentence_image: torch.Tensor, ks: Sequence[int] = KS) -> dict[str, float]:
    """{'i2t_r1', ..., 't2i_r10', 'mR'} for one similarity matrix (images x sentences)."""
    i2t = recall_from_ranks(image_to_sentence_ranks(sim, sentence_image), ks)
    t2i = recall_from_ranks(sentence_to_image_ranks(sim, sentence_image), ks)
    out = {f"i2t_r{k}": v for k, v in i2t.items()} | {f"t2i_r{k}": v for k, v in t2i.items()}
    out["mR"] = sum(i2t.values()) / (2 * len(ks)) + sum(t2i.values()) / (2 * len(ks))
    return out


def per_language_recalls(
    image_emb: torch.Tensor,
    sentence_emb: torch.Tensor,
    sentence_image: torch.Tensor,
    sentence_lang: torch.Tensor,
    languages: Sequence[str],
    ks: Sequence[int] = KS,
) -> dict[str, dict[str, float]]:
    """The paper's protocol: per language, over the images that have captions in it."""
    table: dict[str, dict[str, float]] = {}
    for index, lang in enumerate(languages):
        rows = (sentence_lang == index).nonzero(as_tuple=True)[0]
        if rows.numel() == 0:
            continue
        images, local = torch.unique(sentence_image[rows], return_inverse=True)
        sim = image_emb[images] @ sentence_emb[rows].T
        table[lang] = retrieval_recalls(sim, local, ks) | {
            "images": float(images.numel()),
            "sentences": float(rows.numel()),
        }
    return table


def chance_table(sentence_image: torch.Tensor, sentence_lang: torch.Tensor, languages: Sequence[str],
                 ks: Sequence[int] = KS) -> dict[str, dict[str, float]]:  # fmt: skip
    """per_language_recalls' rows for a model that ranks at random, over the same images and
    sentences: what a table's figures must clearly beat (31 images with 5 captions each: mR
    about 17, not 0.5)."""
    table: dict[str, dict[str, float]] = {}
    for index, lang in enumerate(languages):
        rows = (sentence_lang == index).nonzero(as_tuple=True)[0]
        if rows.numel() == 0:
            continue
        counts = torch.unique(sentence_image[rows], return_counts=True)[1].tolist()
        table[lang] = chance_recalls(counts, ks) | {"images": float(len(counts)), "sentences": float(rows.numel())}
    return table


def mean_mr(table: dict[str, dict[str, float]]) -> float:
    """Model-selection score: mR averaged over languages."""
    return sum(row["mR"] for row in table.values()) / max(len(table), 1)


def mean_r1(table: dict[str, dict[str, float]]) -> float:
    """The mean R@1 of a cross-lingual table (LP's validation score)."""
    return sum(row["r1"] for row in table.values()) / len(table) if table else 0.0


def _language_pairs(sentence_emb, sentence_group, sentence_lang, languages, ks, eligible):
    """For each ordered pair (a, b): eligible captions in a whose group has an eligible
    caption in b are queries; the candidates are b's eligible captions; a hit at K if a
    candidate of the query's group is among the top K."""
    out: dict[str, dict[str, float]] = {}
    for ia, a in enumerate(languages):
        for ib, b in enumerate(languages):
            if ia == ib:
                continue
            queries = ((sentence_lang == ia) & eligible).nonzero(as_tuple=True)[0]
            candidates = ((sentence_lang == ib) & eligible).nonzero(as_tuple=True)[0]
            queries = queries[torch.isin(sentence_group[queries], sentence_group[candidates])]
            if queries.numel() == 0:
                continue
            sim = sentence_emb[queries] @ sentence_emb[candidates].T
            ranks = grouped_ranks(sim, sentence_group[queries], sentence_group[candidates])
            recalls = recall_from_ranks(ranks, ks)
            out[f"{a}->{b}"] = {f"r{k}": v for k, v in recalls.items()} | {"queries": float(queries.numel())}
    return out


def cross_lingual_recalls(
    sentence_emb: torch.Tensor,
    sentence_image: torch.Tensor,
    sentence_lang: torch.Tensor,
    languages: Sequence[str],
    ks: Sequence[int] = KS,
) -> dict[str, dict[str, float]]:
    """Sentence -> sentence retrieval across languages (as AME reports it).

    For each ordered pair (a, b): every caption in a whose image has captions in b is a
    query; the candidates are all captions in b; a hit at K if a caption of the query's
    image is among the top K. sentence_emb must be L2-normalised. Keys are "a->b".
    """
    every = torch.ones_like(sentence_lang, dtype=torch.bool)
    return _language_pairs(sentence_emb, sentence_image, sentence_lang, languages, ks, every)


def translation_pair_recalls(
    sentence_emb: torch.Tensor,
    sentence_group: torch.Tensor,
    sentence_lang: torch.Tensor,
    languages: Sequence[str],
    ks: Sequence[int] = KS,
) -> dict[str, dict[str, float]]:
    """Sentence -> its translation (Multi30K task1's protocol, parallel lines).

    sentence_group: captions that translate one another share a group (>= 0); -1 for a
    caption with none. For each ordered pair (a, b): every caption in a whose group has a
    caption in b is a query; the candidates are b's captions that have a group (its
    translated lines, not its other captions); a hit at K if the query's own translation
    is among the top K. sentence_emb must be L2-normalised. Keys are "a->b".
    """
    return _language_pairs(sentence_emb, sentence_group, sentence_lang, languages, ks, sentence_group >= 0)


def perfect_translation_ceiling(
    sentence_emb: torch.Tensor,
    sentence_image: torch.Tensor,
    sentence_group: torch.Tensor,
    sentence_lang: torch.Tensor,
    source: int,
    ks: Sequence[int] = KS,
) -> dict[str, float]:
    """What image-level source->x recall would be if x's translated lines were perfect:
    the source language's queries (all its captions) against its own translated lines
    (sentence_group >= 0: the lines the other languages translate), a hit at K if a line
    of the query's image is among the top K. A query that is itself a line finds itself;
    the others must find a paraphrase. Cross-lingual alignment cannot lift source->x past
    this: only better paraphrase retrieval can (docs/training-at-scale.md)."""
    in_source = sentence_lang == source
    candidates = (in_source & (sentence_group >= 0)).nonzero(as_tuple=True)[0]
    queries = in_source.nonzero(as_tuple=True)[0]
    queries = queries[torch.isin(sentence_image[queries], sentence_image[candidates])]
    if queries.numel() == 0:
        return {}
    sim = sentence_emb[queries] @ sentence_emb[candidates].T
    ranks = grouped_ranks(sim, sentence_image[queries], sentence_image[candidates])
    return {f"r{k}": v for k, v in recall_from_ranks(ranks, ks).items()} | {"queries": float(queries.numel())}


def expected_hit_rate(candidates: int, positives: int, k: int) -> float:
    """Chance that at least one of `positives` items lands in the top k when `candidates`
    items (positives included) are tied and ordered at random: 1 - C(n-p, k) / C(n, k)."""
    if k >= candidates:
        return 1.0
    miss = 1.0
    for i in range(k):  # C(n-p, k) / C(n, k) as a product, without huge binomials
        miss *= max(0, candidates - positives - i) / (candidates - i)
    return 1.0 - miss


def expected_hit_rate_ranked(groups: Sequence[tuple[int, int]], k: int) -> float:
    """Like expected_hit_rate, for candidates in tie groups ranked one after another:
    groups = [(size, positives in it), ...], best group first; random order within a group."""
    above = 0
    for size, positives in groups:
        if above >= k:
            return 0.0
        slots = k - above
        if slots < size:
            return expected_hit_rate(size, positives, slots)
        if positives:
            return 1.0
        above += size
    return 0.0


def ceiling_recalls(image_groups: Sequence[Sequence[tuple[int, int]]], sentence_matches: Sequence[int],
                    ks: Sequence[int] = KS) -> dict[str, float]:  # fmt: skip
    """Expected recalls of a model that knows exactly which items fit a query, and so how
    likely each is: it ranks fitting items first, more likely ones higher, and orders
    equally likely ones at random.

    image_groups: per image, its fitting sentences as tie groups, best first:
        [(sentences in the group, of which the image's own), ...].
    sentence_matches: per sentence, the number of images that fit it (its own included);
        each is equally likely, so they form one tie group.
    """
    out = {}
    for k in ks:
        out[f"i2t_r{k}"] = 100 * sum(expected_hit_rate_ranked(g, k) for g in image_groups) / len(image_groups)
    for k in ks:
        out[f"t2i_r{k}"] = 100 * sum(expected_hit_rate(n, 1, k) for n in sentence_matches) / len(sentence_matches)
    out["mR"] = sum(out[f"{d}_r{k}"] for d in ("i2t", "t2i") for k in ks) / (2 * len(ks))
    return out


def chance_recalls(captions_per_image: Sequence[int], ks: Sequence[int] = KS) -> dict[str, float]:
    """The expected recalls of a model that ranks at random, for one language's test set
    (each image with its number of captions): what a trained model must clearly beat."""
    sentences, images = sum(captions_per_image), len(captions_per_image)
    out = {f"i2t_r{k}": 100 * sum(expected_hit_rate(sentences, m, k) for m in captions_per_image) / images
           for k in ks}  # fmt: skip
    out |= {f"t2i_r{k}": 100 * expected_hit_rate(images, 1, k) for k in ks}
    out["mR"] = sum(out.values()) / len(out)
    return out
