"""Tokenisation and vocabularies."""

import pytest
import torch

from mule_core.text import PAD, UNK, Vocab, pad_batch, tokenize


def test_moses_tokenisation_lower_cases_and_splits_punctuation():
    assert tokenize("A dog, running.", "en") == ["a", "dog", ",", "running", "."]
    assert tokenize("Zwei Männer\u200b reden.", "de") == ["zwei", "männer", "reden", "."]  # zero-width space dropped
    assert tokenize("L'homme court.", "fr") == ["l'", "homme", "court", "."]


def test_vocab_reserves_pad_and_unknown():
    vocab = Vocab.build([["b", "a"], ["a", "c"]])
    assert vocab.tokens == [PAD, UNK, "a", "b", "c"]
    assert vocab.encode(["c", "zzz", "a"]) == [4, 1, 2]


def test_pad_batch_pads_truncates_and_never_yields_empty_rows():
    tokens, lengths = pad_batch([[5, 6, 7], [8], []], max_tokens=2)
    assert tokens.tolist() == [[5, 6], [8, 0], [1, 0]]
    assert lengths.tolist() == [2, 1, 1]
    assert tokens.dtype == torch.int64


def test_japanese_is_segmented_by_janome_on_real_sentences():
    # STAIR-style captions: particles, verb endings and katakana loanwords split off
    assert tokenize("二人の男性がテーブルでピザを食べている。", "ja") == [
        "二", "人", "の", "男性", "が", "テーブル", "で", "ピザ", "を", "食べ", "て", "いる", "。"]  # fmt: skip
    assert tokenize("ＴＶの前に座る猫", "ja") == ["tv", "の", "前", "に", "座る", "猫"]  # NFKC folds full-width letters


def test_chinese_is_segmented_by_jieba_on_real_sentences():
    # COCO-CN-style captions
    assert tokenize("一个男人在街上骑自行车。", "zh") == ["一个", "男人", "在", "街上", "骑", "自行车", "。"]
    assert tokenize("两只长颈鹿站在草地上", "zh") == ["两只", "长颈鹿", "站", "在", "草地", "上"]


def test_the_tokeniser_is_chosen_by_language_code():
    from mule_core.languages import tokenizer_name

    assert [tokenizer_name(code) for code in ("en", "de", "ja", "zh")] == ["moses", "moses", "janome", "jieba"]
    with pytest.raises(ValueError, match="no tokeniser for language code 'xx'; supported codes: as, bn"):
        tokenizer_name("xx")
