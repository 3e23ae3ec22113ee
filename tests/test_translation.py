"""Offline word-by-word translation: lexicon tables and IBM Model 1, checked by hand."""

import pytest

from mule.words.translation import WordTable, best_translations, ibm_model1


def test_a_word_table_keeps_and_counts_words_it_lacks():
    table = WordTable({"dog": "hund", "a": "ein"})
    assert table.translate(["a", "brown", "dog"]) == (["ein", "brown", "hund"], 1)


def test_ibm_model1_learns_the_textbook_example():
    # Koehn's example: "the" co-occurs with both nouns, so EM pins das <- the, Haus <- house.
    pairs = [(["the", "house"], ["das", "haus"]), (["the", "book"], ["das", "buch"]), (["a", "book"], ["ein", "buch"])]
    t = ibm_model1(pairs, iterations=20)
    assert t[("the", "das")] > 0.8 and t[("house", "haus")] > 0.6 and t[("book", "buch")] > 0.8
    assert t[("a", "ein")] > 0.6
    for source in ("the", "house", "book", "a"):  # t(. | e) is a distribution
        assert sum(p for (e, _), p in t.items() if e == source) == pytest.approx(1.0)
    table = best_translations(t)
    assert table.translate(["the", "book"]) == (["das", "buch"], 0)


def test_one_em_step_by_hand():
    # One pair, one target word: its posterior splits between NULL and "dog" by t, uniform at
    # the start; after one step t(hund | dog) = 1 (dog's only co-occurrence).
    t = ibm_model1([(["dog"], ["hund"])], iterations=1)
    assert t == {("<null>", "hund"): 1.0, ("dog", "hund"): 1.0}


def test_rare_alignments_are_left_untranslated():
    table = best_translations({("dog", "hund"): 0.9, ("cat", "katze"): 0.05, ("cat", "hund"): 0.04})
    assert table.entries == {"dog": "hund"}
