"""Tokenisation and vocabularies."""

import pytest
import torch

from mule.mule_core.vocabulary import PAD, UNK, Vocab, Vocabulary, pad_batch, tokenize


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


def test_pad_batch_takes_no_fewer_than_one_token():
    with pytest.raises(ValueError, match="max_tokens must be 1 or more"):
        pad_batch([[5]], max_tokens=0)


def test_a_sentence_s_words_are_their_rows_and_pad_and_unk_written_out_are_unknown():
    """Known words are their rows; "<pad>" and "<unk>" typed in a caption are words outside
    the vocabulary (not row 0, which pads), with nothing to compose them from: <unk>."""
    vocabulary = Vocabulary(["en"], {"en": Vocab.build([["a", "dog"]])})
    encoded = vocabulary.encode("en", [["a", "dog"], ["dog", "<pad>", "zzz", "<unk>"], []])
    assert encoded.ids == [[2, 3], [3, 1, 1, 1], []]
    assert encoded.unknown == [[], ["<pad>", "zzz", "<unk>"], []] and encoded.composed == [[], [], []]


def test_japanese_is_segmented_by_janome_on_real_sentences():
    # STAIR-style captions: particles, verb endings and katakana loanwords split off
    assert tokenize("二人の男性がテーブルでピザを食べている。", "ja") == [
        "二", "人", "の", "男性", "が", "テーブル", "で", "ピザ", "を", "食べ", "て", "いる", "。"]  # fmt: skip
    assert tokenize("ＴＶの前に座る猫", "ja") == ["tv", "の", "前", "に", "座る", "猫"]  # NFKC folds full-width letters


@pytest.mark.slow
def test_chinese_is_segmented_by_jieba_on_real_sentences():
    # COCO-CN-style captions
    assert tokenize("一个男人在街上骑自行车。", "zh") == ["一个", "男人", "在", "街上", "骑", "自行车", "。"]
    assert tokenize("两只长颈鹿站在草地上", "zh") == ["两只", "长颈鹿", "站", "在", "草地", "上"]


def test_the_tokeniser_is_chosen_by_language_code():
    from mule.mule_core.languages import tokenizer_name

    assert [tokenizer_name(code) for code in ("en", "de", "es", "pt-BR", "ja", "zh", "zh-Hant", "th", "sw", "am")] == [
        "moses", "moses", "moses", "moses", "janome", "jieba", "jieba", "unicode", "unicode", "unicode"]  # fmt: skip
    assert tokenizer_name("th", {"th": "moses"}) == "moses"  # text.tokenizers overrides the rule
    with pytest.raises(ValueError, match="th='icu' is not a tokeniser"):
        tokenizer_name("th", {"th": "icu"})


def test_the_codes_language_code_passes_without_langcodes_are_already_standard():
    """language_code answers mule's own tokeniser codes without importing langcodes (a tenth
    of a no-change rebuild): each must be a valid tag that langcodes would leave as it is."""
    import langcodes

    from mule.mule_core.languages import STANDARD, language_code

    for code in sorted(STANDARD):
        assert langcodes.tag_is_valid(code) and langcodes.standardize_tag(code) == code, code
        assert language_code(code) == code
    assert language_code("pt_br") == "pt-BR" and language_code(" de ") == "de"


def test_languages_without_a_rule_of_their_own_are_split_at_unicode_word_boundaries():
    # Swahili and Amharic: words and punctuation (UAX #29); an apostrophe inside a word stays
    assert tokenize("Mtoto anacheza mpira, uwanjani.", "sw") == ["mtoto", "anacheza", "mpira", ",", "uwanjani", "."]
    assert tokenize("ሰላም ልጆች።", "am") == ["ሰላም", "ልጆች", "።"]
    # Thai has no spaces between words and UAX #29 no dictionary: one grapheme cluster a token
    # (what the word vectors' character n-grams then learn from)
    assert tokenize("วงกลมสีแดง", "th") == ["ว", "ง", "ก", "ล", "ม", "สี", "แ", "ด", "ง"]
    assert tokenize("Mtoto anacheza.", "sw", {"sw": "moses"}) == ["mtoto", "anacheza", "."]


def test_the_language_is_the_one_whose_vocabulary_knows_most_of_the_words():
    """With the identifier off: the share of the words each vocabulary knows, a tie to the
    language where the words are more frequent (earlier in its vocabulary)."""
    from mule.mule_core.language_id import detect_language
    from mule.mule_core.vocabulary import PAD, UNK, Vocab

    vocabs = {"en": Vocab([PAD, UNK, "a", "red", "circle", "on", "the", "left"]),
              "de": Vocab([PAD, UNK, "ein", "roter", "kreis", "links", "a"]),
              "fr": Vocab([PAD, UNK, "un", "cercle", "rouge", "à", "gauche"])}  # fmt: skip
    guess = detect_language("Ein roter Kreis links", vocabs, use_identifier=False)
    assert guess.lang == "de" and guess.known == {"en": 0, "de": 4, "fr": 0}
    assert guess.describe() == "de 4/4 words, en 0/4 words, fr 0/4 words"
    assert detect_language("a red circle", vocabs, use_identifier=False).lang == "en"  # 3/3 against German's 1/3
    assert detect_language("a", vocabs, use_identifier=False).lang == "en"  # 1/1 each: "a" is earlier in en's
    vocabs["de"] = Vocab([PAD, UNK, "a", "ein"])
    vocabs["en"] = Vocab([PAD, UNK, "the", "red", "a"])
    assert detect_language("a", vocabs, use_identifier=False).lang == "de"
    assert detect_language("xyzzy", vocabs).lang is None  # no language knows it: no guess


def test_english_is_english_though_an_added_vocabulary_knows_its_words():
    """An added language's words come from a web list that holds English: its vocabulary knows
    every word of an English sentence. The identifier (restricted to the model's languages)
    tells them apart; the words alone could not."""
    from mule.mule_core.language_id import detect_language
    from mule.mule_core.vocabulary import PAD, UNK, Vocab

    english = ["the", "dog", "runs", "in", "park", "a", "man", "with", "red", "shirt"]
    vocabs = {"en": Vocab([PAD, UNK, *english]),
              "cs": Vocab([PAD, UNK, "pes", "běží", "v", "parku", "muž"]),
              "es": Vocab([PAD, UNK, "el", "perro", "corre", "en", "parque", "un", "hombre", *english])}  # fmt: skip
    words_alone = detect_language("the dog runs in the park", vocabs, use_identifier=False)
    assert words_alone.known["en"] == words_alone.known["es"] == 6  # a tie on the words
    guess = detect_language("the dog runs in the park", vocabs)
    assert guess.lang == "en" and guess.identified["en"] > 0.9 > guess.identified["es"]
    assert guess.describe() == "en 1.00 x 6/6 words, es 0.00 x 6/6 words, cs 0.00 x 0/6 words"
    assert detect_language("el perro corre en el parque", vocabs).lang == "es"
    assert detect_language("pes běží v parku", vocabs).lang == "cs"
    # one word: the vocabularies decide where the identifier cannot ("dog" reads as Czech to it alone)
    assert detect_language("dog", {k: v for k, v in vocabs.items() if k != "es"}).lang == "en"


def test_a_language_the_identifier_does_not_know_is_found_by_its_words():
    from mule.mule_core.language_id import detect_language, identified
    from mule.mule_core.vocabulary import PAD, UNK, Vocab

    vocabs = {"en": Vocab([PAD, UNK, "the", "dog", "runs"]), "tlh": Vocab([PAD, UNK, "qagh", "ghargh", "vIghro'"])}
    probabilities = identified("qagh ghargh", list(vocabs))
    assert probabilities["tlh"] == 0.5 and abs(sum(probabilities.values()) - 1) < 1e-6  # an even share
    assert detect_language("qagh ghargh", vocabs).lang == "tlh"
    assert detect_language("the dog runs", vocabs).lang == "en"


def test_a_language_is_read_one_way_everywhere():
    """Codes in any case, names, CLDR's names with a script or region: the region or script
    is kept, and a variety folds into a language only in the same script."""
    import pytest

    from mule.mule_core.languages import LanguageCodeError, read_language

    assert read_language("EN") == ("en", "") and read_language("pt_br") == ("pt-BR", "")
    assert read_language("German") == ("de", "its name") and read_language("Deutsch")[0] == "de"
    assert read_language("Portuguese (Brazil)")[0] == "pt-BR" and read_language("Português (Brasil)")[0] == "pt-BR"
    assert read_language("Serbian (Latin)")[0] == "sr-Latn" and read_language("Serbian (Cyrillic)")[0] == "sr-Cyrl"
    assert read_language("Chinese (Simplified)")[0] == "zh-Hans" and read_language("Chinese (Traditional)")[0] == "zh-Hant"
    assert read_language("en-US", ["en", "de"]) == ("en", "en without en-US's subtags")
    assert read_language("Portuguese (Brazil)", ["pt", "pt-BR"])[0] == "pt-BR"  # kept apart
    assert read_language("Chinese (Simplified)", ["zh"])[0] == "zh"  # zh is written in Simplified Han
    with pytest.raises(LanguageCodeError, match="another script"):
        read_language("zh-Hant", ["zh"])
    with pytest.raises(LanguageCodeError, match="another script"):
        read_language("Serbian (Latin)", ["sr"])
    with pytest.raises(LanguageCodeError, match="none of the languages here: pt-BR"):
        read_language("pt", ["pt-BR"])
    with pytest.raises(LanguageCodeError, match="nor a language's name"):
        read_language("xx")


def test_file_digests_follow_the_bytes_not_the_timestamps(tmp_path):
    import os

    from mule.storage.content_digests import FileHasher, sha256_file
    from mule.storage.workdir import Workdir

    wd = Workdir.at(tmp_path / "work")
    data = tmp_path / "data"
    data.mkdir()
    (data / "a.txt").write_text("one")
    (data / "b.txt").write_text("two")
    hasher = FileHasher(wd)
    tree = hasher.tree(data)
    assert hasher.digest(data / "a.txt") == sha256_file(data / "a.txt")
    hasher.save()
    os.utime(data / "a.txt", ns=(1, 1))  # touched: same bytes, same digest
    assert FileHasher(wd).tree(data) == tree
    (data / "b.txt").write_text("TWO")  # new bytes: new digest
    assert FileHasher(wd).tree(data) != tree
    (data / "b.txt").write_text("two")
    assert FileHasher(wd).tree(data) == tree
    (data / "b.txt").rename(data / "c.txt")  # a renamed file changes the tree
    assert FileHasher(wd).tree(data) != tree


def test_tree_digests_follow_linked_folders_and_stop_at_loops(tmp_path):
    """`images -> /data/flickr30k-images`: a file replaced behind the link is a change;
    a link back up the tree is not followed forever."""
    from mule.storage.content_digests import FileHasher
    from mule.storage.workdir import Workdir

    wd = Workdir.at(tmp_path / "work")
    outside = tmp_path / "flickr30k-images"
    outside.mkdir()
    (outside / "1.jpg").write_bytes(b"first")
    dataset = tmp_path / "multi30k"
    dataset.mkdir()
    (dataset / "captions.txt").write_text("a dog\n")
    plain = FileHasher(wd).tree(dataset)
    (dataset / "images").symlink_to(outside, target_is_directory=True)
    (outside / "back").symlink_to(dataset, target_is_directory=True)  # a loop: images/back/images/back/...
    linked = FileHasher(wd).tree(dataset)
    assert linked != plain  # the linked folder's files count
    (outside / "1.jpg").write_bytes(b"other")  # replaced behind the link
    assert FileHasher(wd).tree(dataset) != linked
    (outside / "1.jpg").write_bytes(b"first")
    assert FileHasher(wd).tree(dataset) == linked
    # the same files in a real folder give the same digest as behind a link
    copy = tmp_path / "copy"
    copy.mkdir()
    (copy / "captions.txt").write_text("a dog\n")
    (copy / "images").mkdir()
    (copy / "images" / "1.jpg").write_bytes(b"first")
    (copy / "images" / "back").symlink_to(copy, target_is_directory=True)
    assert FileHasher(wd).tree(copy) == linked


@pytest.mark.slow
def test_the_ingest_stage_s_processes_give_every_caption_the_words_one_process_gives(monkeypatch):
    """Enough captions are tokenised by a pool of processes (tasks/ingest.py): each
    (text, language) gets the words tokenize gives it here, in the captions' order, in
    every tokeniser's language."""
    import logging

    from mule.mule_core import devices
    from mule.mule_core.progress import Progress
    from mule.tasks import ingest

    pools = []
    started = devices.worker_processes
    monkeypatch.setattr(devices, "worker_processes", lambda n: pools.append(n) or started(n))
    monkeypatch.setattr(ingest, "TOKENISE_IN_PROCESSES_FROM", 0)
    monkeypatch.setattr(ingest, "CHUNK", 7)  # chunks of 7, the last one short
    monkeypatch.setenv("OMP_NUM_THREADS", "2")  # two processes, whatever the machine
    lines = [("A dog, running.", "en"), ("Zwei Männer reden.", "de"), ("L'homme court.", "fr"),
             ("Dva muži si povídají.", "cs"), ("二人の男性がテーブルでピザを食べている。", "ja"),
             ("两个男人在桌子上吃披萨。", "zh"), ("Dos hombres comen pizza.", "es")]  # fmt: skip
    pairs = [(f"{text} {n}", lang) for n in range(9) for text, lang in lines]  # 63 distinct captions
    progress = Progress("tokenising", len(pairs), unit="captions", logger=logging.getLogger("test"))
    words = ingest.tokenised(pairs, {}, progress)
    assert pools == [2] and progress.done == len(pairs)
    assert words == [tokenize(text, lang) for text, lang in pairs]
