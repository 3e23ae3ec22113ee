"""Retrieval metrics on similarity matrices whose recalls can be read off by eye."""

import pytest
import torch

from mule.mule_core.metrics import (
    cross_lingual_recalls,
    grouped_ranks,
    image_to_sentence_ranks,
    per_language_recalls,
    retrieval_recalls,
    sentence_to_image_ranks,
)

# 3 images x 6 sentences; sentences 2i and 2i+1 describe image i.
SIM = torch.tensor(
    [
        # s0   s1   s2   s3   s4   s5
        [0.9, 0.1, 0.8, 0.2, 0.0, 0.3],  # image 0: best own 0.9 -> rank 0
        [0.7, 0.6, 0.5, 0.4, 0.3, 0.8],  # image 1: best own 0.5; above: 0.7, 0.6, 0.8 -> rank 3
        [0.1, 0.2, 0.3, 0.4, 0.5, 0.6],  # image 2: best own 0.6 -> rank 0
    ]
)
SENTENCE_IMAGE = torch.tensor([0, 0, 1, 1, 2, 2])


def test_image_to_sentence_ranks():
    assert image_to_sentence_ranks(SIM, SENTENCE_IMAGE).tolist() == [0, 3, 0]


def ranks_by_definition(sim, query_group, candidate_group):
    """The docstring's rank, one query at a time: candidates of other groups scoring at
    least as high as the best candidate of the query's own group (-inf with none)."""
    ranks = []
    for q in range(sim.shape[0]):
        own = [sim[q, c].item() for c in range(sim.shape[1]) if candidate_group[c] == query_group[q]]
        best = max(own, default=float("-inf"))
        ranks.append(sum(1 for c in range(sim.shape[1])
                         if candidate_group[c] != query_group[q] and sim[q, c].item() >= best))  # fmt: skip
    return ranks


@pytest.mark.parametrize("seed", range(6))
def test_grouped_ranks_are_the_definition_s_with_ties_gaps_and_chunks(seed):
    generator = torch.Generator().manual_seed(seed)
    n_queries, n_candidates = 23, 31
    sim = torch.randint(0, 5, (n_queries, n_candidates), generator=generator).float()  # many ties
    sim[0, :4] = float("-inf")
    candidate_group = torch.randint(0, 9, (n_candidates,), generator=generator)  # groups in no order, of any size
    query_group = torch.randint(0, 11, (n_queries,), generator=generator)  # 9 and 10: no candidate of the group
    query_group[:3] = torch.tensor([9, 10, candidate_group[0].item()])
    sim[2, candidate_group == query_group[2]] = float("-inf")  # its best positive: -inf
    expected = ranks_by_definition(sim, query_group, candidate_group)
    assert expected[0] == expected[1] == n_candidates  # no candidate of its group: behind every one
    assert expected[2] == int((candidate_group != query_group[2]).sum())  # behind every other group's
    for chunk in (4096, 7, 1):
        assert grouped_ranks(sim, query_group, candidate_group, chunk=chunk).tolist() == expected
    # a group of one candidate each (sentence -> sentence in one language: no caption shares a group)
    assert grouped_ranks(sim, torch.arange(n_queries), torch.arange(n_candidates)).tolist() == \
        ranks_by_definition(sim, torch.arange(n_queries), torch.arange(n_candidates))  # fmt: skip
    # no candidates at all
    assert grouped_ranks(sim[:, :0], query_group, candidate_group[:0]).tolist() == [0] * n_queries


def test_sentence_to_image_ranks():
    # column s: rank of its own image among the 3 images
    # s0 own 0.9: rank 0; s1 own 0.1: 0.6, 0.2 above -> 2; s2 own 0.5: 0.8 above -> 1;
    # s3 own 0.4: 0.4 (image 2) ties count against -> 1; s4 own 0.5: rank 0; s5 own 0.6: 0.8 above -> 1
    assert sentence_to_image_ranks(SIM, SENTENCE_IMAGE).tolist() == [0, 2, 1, 1, 0, 1]


def test_recalls_and_mean_recall():
    recalls = retrieval_recalls(SIM, SENTENCE_IMAGE, ks=(1, 2))
    assert recalls["i2t_r1"] == pytest.approx(200 / 3)
    assert recalls["i2t_r2"] == pytest.approx(200 / 3)
    assert recalls["t2i_r1"] == pytest.approx(200 / 6)
    assert recalls["t2i_r2"] == pytest.approx(500 / 6)
    assert recalls["mR"] == pytest.approx((200 / 3 + 200 / 3 + 200 / 6 + 500 / 6) / 4)


def test_ties_count_against_the_model():
    # A model that scores everything the same retrieves nothing.
    flat = torch.zeros(3, 6)
    recalls = retrieval_recalls(flat, SENTENCE_IMAGE, ks=(1,))
    assert recalls["i2t_r1"] == 0.0 and recalls["t2i_r1"] == 0.0


def test_per_language_evaluates_only_images_with_captions_in_that_language():
    image_emb = torch.eye(3)
    # en captions for images 0, 1, 2; fr caption only for image 1 (it matches image 1 perfectly).
    sentence_emb = torch.tensor([[1.0, 0, 0], [0, 1.0, 0], [0, 0, 1.0], [0, 1.0, 0]])
    table = per_language_recalls(
        image_emb, sentence_emb, torch.tensor([0, 1, 2, 1]), torch.tensor([0, 0, 0, 1]), ["en", "fr"], ks=(1,)
    )
    assert table["en"]["images"] == 3 and table["fr"]["images"] == 1
    assert table["en"]["mR"] == 100.0 and table["fr"]["mR"] == 100.0


def test_cross_lingual_retrieval():
    # Image 0 has en s0 and de s2; image 1 has en s1 and de s3. en s1 is closer to de s2.
    emb = torch.nn.functional.normalize(torch.tensor([[1.0, 0.0], [0.6, 0.8], [0.8, 0.6], [0.0, 1.0]]), dim=-1)
    table = cross_lingual_recalls(emb, torch.tensor([0, 1, 0, 1]), torch.tensor([0, 0, 1, 1]), ["en", "de"], ks=(1, 2))
    assert table["en->de"]["r1"] == 50.0  # s0 -> s2 right, s1 -> s2 wrong
    assert table["en->de"]["r2"] == 100.0
    assert table["de->en"]["queries"] == 2


def test_translation_pairs_count_only_the_query_s_own_translation():
    from mule.mule_core.metrics import translation_pair_recalls

    # en s0, s1 (s1 translated into de s2: group 0), a second image's en s3 (translated into de s4:
    # group 1) and de s5, an independent German caption (no group: never a candidate).
    emb = torch.nn.functional.normalize(torch.tensor(
        [[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.1, 0.9], [1.0, 0.05], [0.95, 0.0]]), dim=-1)  # fmt: skip
    group, lang = torch.tensor([-1, 0, 0, 1, 1, -1]), torch.tensor([0, 0, 1, 0, 1, 1])
    table = translation_pair_recalls(emb, group, lang, ["en", "de"], ks=(1, 2))
    # en s1 -> de: s4 (group 1) beats s2 (its own): miss at 1, hit at 2; en s3 -> de: s2 beats s4: miss.
    # s5 is closest to both but is not a translated line, so it never counts.
    assert table["en->de"] == {"r1": 0.0, "r2": 100.0, "queries": 2.0}
    assert table["de->en"]["queries"] == 2  # s0 has no translation: not a query, not a candidate


def test_the_perfect_translation_ceiling_asks_english_queries_for_the_translated_english_lines():
    from mule.mule_core.metrics import perfect_translation_ceiling

    # Image 0: en s0 (its translated line, group 0) and s1; image 1: en s2 (line, group 1) and
    # s3; de s4 translates s0. s1 is closer to image 1's line s2 than to its own line s0.
    emb = torch.nn.functional.normalize(torch.tensor(
        [[1.0, 0.0], [0.3, 1.0], [0.0, 1.0], [0.1, 1.0], [1.0, 0.1]]), dim=-1)  # fmt: skip
    image, group, lang = torch.tensor([0, 0, 1, 1, 0]), torch.tensor([0, -1, 1, -1, 0]), torch.tensor([0, 0, 0, 0, 1])
    table = perfect_translation_ceiling(emb, image, group, lang, source=0, ks=(1, 2))
    # s0 and s2 find themselves, s3 finds s2 (its image's line), s1 finds s2 first: 3 of 4.
    assert table == {"r1": 75.0, "r2": 100.0, "queries": 4.0}


def test_translation_groups_number_captions_that_translate_one_another():
    from mule.data_catalog.splits import translation_groups

    # keys: the caption translated from (or the caption itself); a key seen once is no pair
    assert translation_groups(["a", "b", "a", "c", "c", "a"]).tolist() == [0, -1, 0, 1, 1, 0]


def test_chance_beside_a_table_counts_each_languages_own_images_and_sentences_by_hand():
    from mule.mule_core.metrics import chance_table

    # en: image 0 has two captions, images 1 and 2 one each; fr: images 0 and 1, one each.
    sentence_image = torch.tensor([0, 0, 1, 2, 0, 1])
    sentence_lang = torch.tensor([0, 0, 0, 0, 1, 1])
    table = chance_table(sentence_image, sentence_lang, ["en", "fr", "cs"], ks=(1,))
    assert set(table) == {"en", "fr"}  # no captions in cs: no row, as in the recall table
    # en, sentence -> image: its image first among 3: 1/3. image -> sentence: image 0 has 2
    # of the 4 sentences (1/2 to be first), images 1 and 2 one each (1/4): mean 1/3.
    assert table["en"]["t2i_r1"] == pytest.approx(100 / 3)
    assert table["en"]["i2t_r1"] == pytest.approx(100 * (1 / 2 + 1 / 4 + 1 / 4) / 3)
    assert (table["en"]["images"], table["en"]["sentences"]) == (3, 4)
    assert table["fr"] == pytest.approx({"i2t_r1": 50.0, "t2i_r1": 50.0, "mR": 50.0, "images": 2, "sentences": 2})


@pytest.mark.slow
def test_chance_is_what_random_scores_average_under_the_metrics_own_protocol():
    from mule.mule_core.metrics import chance_table, retrieval_recalls

    # 31 photos with five captions each (a test_2016 slice): chance mR is about 17, not 0.5.
    sentence_image = torch.arange(31).repeat_interleave(5)
    expected = chance_table(sentence_image, torch.zeros(155, dtype=torch.long), ["en"])["en"]
    generator = torch.Generator().manual_seed(0)
    draws = [retrieval_recalls(torch.rand(31, 155, generator=generator), sentence_image) for _ in range(3000)]
    for key in ("i2t_r1", "i2t_r5", "i2t_r10", "t2i_r1", "t2i_r5", "t2i_r10", "mR"):
        assert sum(d[key] for d in draws) / len(draws) == pytest.approx(expected[key], abs=0.6), key
    assert 16 < expected["mR"] < 19
    assert expected["t2i_r5"] == pytest.approx(100 * 5 / 31)


def test_chance_recalls_by_hand():
    from mule.mule_core.metrics import chance_recalls

    # Two images with one caption each: a random ranking puts the right one first half the time.
    two = chance_recalls([1, 1], ks=(1, 5))
    assert two == {"i2t_r1": 50.0, "i2t_r5": 100.0, "t2i_r1": 50.0, "t2i_r5": 100.0, "mR": 75.0}
    # Image with 2 of 4 captions: at least one of its two in the top 1 of 4: 1/2; in the top 2: 1 - (2/4)(1/3).
    assert chance_recalls([2, 2], ks=(1, 2))["i2t_r2"] == pytest.approx(100 * (1 - 1 / 6))
