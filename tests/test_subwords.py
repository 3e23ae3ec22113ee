"""Subword vectors (model.subwords): a word's vector is its own plus the mean of its shared
character n-grams' vectors, so training one form of a word moves its other forms; a word
outside the vocabulary is the mean of its n-grams' alone, as fastText builds one."""

import dataclasses

import numpy as np
import pytest
import torch

from mule.config.overrides import from_dict, to_dict
from mule.config.resolution import resolve
from mule.data_catalog.model_files import load_model, save_model
from mule.mule_core.model import MuleModel, TextBatch, count_parameters
from mule.mule_core.settings import LossConfig, ModelConfig, PretrainConfig, TrainConfig
from mule.mule_core.split_tensors import SplitTensors
from mule.mule_core.subwords import char_ngrams, ngram_index
from mule.mule_core.training.lp import LPTrainer
from mule.mule_core.vocabulary import Vocab, Vocabulary, pad_batch

WORDS = ["<pad>", "<unk>", "dog", "dogs", "cat"]
CFG = ModelConfig(mule_dim=6, lstm_dim=5, joint_dim=4, image_hidden=7, ngram_lengths=(3,))


def model_on(words=WORDS, cfg=CFG, dim=2):
    torch.manual_seed(0)
    return MuleModel(["en"], {"en": len(words)}, dim, None, cfg, {"en": words})


def test_char_ngrams_are_fasttexts():
    assert char_ngrams("dog", (3, 4)) == {"<do", "dog", "og>", "<dog", "dog>"}
    assert char_ngrams("a", (3,)) == set()  # "<a>" is the whole wrapped word


def test_only_ngrams_that_two_words_share_get_an_id():
    # dog: <do dog og>; dogs: <do dog ogs gs>; cat: <ca cat at>. Shared: <do, dog.
    index, count = ngram_index(WORDS, (3,))
    assert count == 2
    assert index.tolist() == [[0, 0], [0, 0], [1, 2], [1, 2], [0, 0]]


def test_a_word_is_its_own_vector_plus_the_mean_of_its_ngrams():
    branch = model_on().branches["en"]
    with torch.no_grad():
        branch.embed.weight.copy_(torch.tensor([[0, 0], [9, 9], [1, 0], [0, 1], [5, 5]], dtype=torch.float))
        branch.subwords.vectors.weight.copy_(torch.tensor([[0, 0], [2, 0], [0, 4]], dtype=torch.float))
    vectors = branch.word_vectors(torch.tensor([[2, 3, 4, 0]]))
    assert vectors[0].tolist() == [[2, 2], [1, 3], [5, 5], [0, 0]]  # dog, dogs, cat (no shared n-gram), padding


def test_a_new_model_starts_from_exactly_the_word_vectors_it_was_given():
    model = model_on()
    given = torch.randn(len(WORDS), 2)
    model.branches["en"].init_vectors(given)
    tokens = torch.tensor([[2, 3, 4, 1]])
    expected = given[tokens].clone()
    expected[tokens == 0] = 0
    torch.testing.assert_close(model.branches["en"].word_vectors(tokens), expected)


def test_a_word_outside_the_vocabulary_is_the_mean_of_the_ngrams_it_shares_with_it():
    """dogma: <do dog ogm gma ma> shares <do and dog with the vocabulary; cow shares
    nothing and is <unk>. The same word twice is one row of the unseen table."""
    vocabulary = Vocabulary(["en"], {"en": Vocab(WORDS)}, ngram_lengths=(3,))
    encoded = vocabulary.encode("en", [["dog", "dogma", "cow"], ["dogma", "cat"]])
    assert encoded.ids == [[2, 5, 1], [5, 4]]  # 5 = the vocabulary's size: the first word outside it
    assert encoded.unseen.tolist() == [[1, 2]]  # dogma's n-gram ids
    assert encoded.composed == [["dogma"], ["dogma"]] and encoded.unknown == [["cow"], []]
    branch = model_on().branches["en"]
    with torch.no_grad():
        branch.embed.weight.copy_(torch.tensor([[0, 0], [9, 9], [1, 0], [0, 1], [5, 5]], dtype=torch.float))
        branch.subwords.vectors.weight.copy_(torch.tensor([[0, 0], [2, 0], [0, 4]], dtype=torch.float))
    ids, _ = pad_batch(encoded.ids, 8)
    vectors = branch.word_vectors(ids, encoded.unseen)
    assert vectors.tolist() == [[[2, 2], [1, 2], [9, 9]], [[1, 2], [5, 5], [0, 0]]]  # dog, dogma, <unk>; dogma, cat
    # without subword vectors, every word outside the vocabulary is <unk>
    plain = Vocabulary(["en"], {"en": Vocab(WORDS)}).encode("en", [["dog", "dogma", "cow"]])
    assert plain.ids == [[2, 1, 1]] and plain.unseen is None and plain.unknown == [["dogma", "cow"]]


def test_the_ngrams_start_at_the_word_vector_model_s_and_every_word_at_its_given_vector():
    model = model_on()
    branch = model.branches["en"]
    given = torch.tensor([[0, 0], [7, 7], [3, 1], [1, 3], [4, 4]], dtype=torch.float)
    # the word-vector model's n-grams: "<do" and "dog" are the table's; "cat" is no shared n-gram
    branch.init_vectors(given, (["dog", "cat", "<do"], torch.tensor([[0, 4], [8, 8], [2, 0]], dtype=torch.float)))
    assert branch.subwords.vectors.weight.tolist() == [[0, 0], [2, 0], [0, 4]]
    tokens = torch.tensor([[2, 3, 4, 1, 0]])
    expected = given[tokens].clone()
    expected[tokens == 0] = 0
    torch.testing.assert_close(branch.word_vectors(tokens), expected)
    # an unseen "dogma" starts where fastText puts it: the mean of its n-grams' vectors
    unseen = Vocabulary(["en"], {"en": Vocab(WORDS)}, ngram_lengths=(3,)).encode("en", [["dogma"]])
    assert branch.word_vectors(torch.tensor([[5]]), unseen.unseen).tolist() == [[[1.0, 2.0]]]


def test_fasttext_ngram_rows_are_the_ones_it_averages_into_a_word(tmp_path):
    """The text stage's n-gram vectors are fastText's own input rows: averaged with the
    word's row they give fastText's vector of a word, and alone its vector of an unseen one.
    fastText runs in a fresh process, as the text stage runs it (tasks/shared/fasttext_worker.py):
    in a pytest worker that had run other tests, a fit once ended in "Encountered NaN"
    (tests/test_word_vectors.py says why)."""
    import subprocess
    import sys

    (tmp_path / "corpus.txt").write_text("a brown dog runs\ntwo dogs run\na cat sleeps\n" * 30, encoding="utf-8")
    check = f"""
import numpy as np
from pathlib import Path
from mule.tasks.shared import fasttext_worker
model = fasttext_worker.fit(Path({str(tmp_path / "corpus.txt")!r}), dim=8, model="skipgram", epochs=2, min_count=1,
                            threads=1)
for word in ("dogs", "doggy"):  # in fastText's vocabulary, and not
    names, ids = model.get_subwords(word)
    rows = [fasttext_worker.ngram_row(model, name) if name != word else model.get_input_vector(i)
            for name, i in zip(names, ids)]
    gap = float(np.abs(np.mean(rows, 0) - model.get_word_vector(word)).max())
    print(word, len(rows), gap)
"""
    done = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    checked = [line.split() for line in done.stdout.splitlines()]
    assert [word for word, _, _ in checked] == ["dogs", "doggy"], done.stdout
    assert all(int(rows) > 1 and float(gap) <= 1e-6 for _, rows, gap in checked), done.stdout


@pytest.mark.parametrize("subwords", [True, False])
def test_training_one_form_moves_the_other_only_through_shared_ngrams(subwords):
    """A step on sentences that say only "dogs" changes the vector of "dog" (never seen)
    with subword vectors, and leaves it exactly where it was without them."""
    model = model_on(cfg=dataclasses.replace(CFG, subwords=subwords))
    branch = model.branches["en"]
    dog, cat = torch.tensor([2]), torch.tensor([4])
    before = branch.word_vectors(dog).detach().clone(), branch.word_vectors(cat).detach().clone()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    encoded = model.encode_text(TextBatch(torch.tensor([[3, 3]]), torch.tensor([2]), [("en", 0, 1)]), joint=False)
    encoded.mule.pow(2).sum().backward()
    optimizer.step()
    moved = not torch.equal(branch.word_vectors(dog), before[0])
    assert moved == subwords
    assert torch.equal(branch.word_vectors(cat), before[1])  # shares nothing with "dogs"


def test_ngram_vectors_are_word_parameters_and_counted_as_the_languages_own():
    model = model_on()
    branch = model.branches["en"]
    assert branch.word_parameters() == [branch.embed.weight, branch.subwords.vectors.weight]
    counts = count_parameters(model)
    assert counts["per_language"]["en"] == 5 * 2 + (2 + 1) * 2 + (2 * 6 + 6)  # words, 2 n-grams + padding, FC
    data = SplitTensors(["en"], torch.tensor([[2, 3], [4, 0]]), torch.tensor([2, 1]), np.zeros(2, dtype=np.int64),
                        np.arange(2), ["a", "b"])  # fmt: skip
    trainer = LPTrainer(model, data, LossConfig(), TrainConfig(word_lr_scale=10.0), torch.device("cpu"),
                      pretrain=PretrainConfig(lr=1e-3))  # fmt: skip
    word_group = trainer.optimizer.param_groups[1]
    assert word_group["lr"] == pytest.approx(1e-2)
    assert {id(p) for p in word_group["params"]} == {id(p) for p in branch.word_parameters()}


def test_subword_vectors_need_the_words():
    with pytest.raises(ValueError, match="needs every language's words"):
        MuleModel(["en"], {"en": 5}, 2, None, CFG)


def test_a_saved_model_encodes_the_same_after_loading(tmp_path):
    cfg = resolve("demo", {"model.ngram_lengths": "3", "text.word_dim": 2})
    vocabulary = Vocabulary(["en"], {"en": Vocab(WORDS)}, {"en": torch.randn(5, 2)})
    model = MuleModel(["en"], {"en": 5}, 2, None, cfg.model, {"en": WORDS}).eval()
    with torch.no_grad():
        model.branches["en"].subwords.vectors.weight.normal_()
    save_model(tmp_path / "m.pt", model, cfg, vocabulary, kind="lp")
    loaded, meta = load_model(tmp_path / "m.pt")
    batch = TextBatch(torch.tensor([[2, 3, 4]]), torch.tensor([3]), [("en", 0, 1)])
    assert meta["cfg"].model.subwords
    torch.testing.assert_close(loaded.encode_text(batch).mule, model.encode_text(batch).mule, rtol=0, atol=0)


def test_a_config_stored_before_subwords_existed_reads_as_one_vector_per_word():
    stored = to_dict(resolve("demo"))
    del stored["model"]["subwords"], stored["model"]["ngram_lengths"]
    assert from_dict(stored).model.subwords is False
    assert from_dict(to_dict(resolve("demo"))).model.subwords is True  # today's files keep theirs
    assert resolve("paper").model.subwords is False  # the paper fine-tunes one vector per word


def test_word_vector_gradients_are_the_same_on_every_run_on_several_threads():
    """A resumed run must equal the run never stopped to the bit (tests/test_stopping.py):
    the composition's gradient may not depend on how threads split a sum."""
    words = ["<pad>", "<unk>"] + [f"w{i}x{i % 7}y{i % 13}" for i in range(3000)]
    torch.manual_seed(0)
    branch = MuleModel(["en"], {"en": len(words)}, 16, None, dataclasses.replace(CFG, ngram_lengths=(3, 4)),
                       {"en": words}).branches["en"]  # fmt: skip
    tokens = torch.randint(2, len(words), (512, 12))
    weights = torch.arange(512 * 12 * 16).reshape(512, 12, 16).float().sin()
    threads = torch.get_num_threads()
    torch.set_num_threads(4)
    try:
        grads = []
        for _ in range(5):
            branch.zero_grad(set_to_none=True)
            (branch.word_vectors(tokens) * weights).sum().backward()
            grads.append(branch.embed.weight.grad.clone())
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(g, grads[0]) for g in grads)


@pytest.mark.slow
def test_each_language_s_table_is_built_once_whatever_the_number_of_languages(monkeypatch):
    """A model of 17 languages encodes queries in each, again and again: every language's
    n-gram table is built once (an LRU cache of 16 rebuilt all of them on every query, 10 s
    of CPU for 34 queries), and a vocabulary no longer in use lets its table go, but for the
    last eight built (the next stage of a run reads them again)."""
    import gc

    from mule.mule_core import subwords
    from mule.mule_core.vocabulary import Vocab, Vocabulary

    built = []
    real = subwords.NgramTable.__init__
    monkeypatch.setattr(subwords.NgramTable, "__init__", lambda self, *a: built.append(1) or real(self, *a))
    languages = [f"l{n:02d}" for n in range(17)]
    vocabs = {lang: Vocab.build([[f"{lang}word{i}", f"{lang}wort{i}"] for i in range(50)]) for lang in languages}
    vocabulary = Vocabulary(languages, vocabs, ngram_lengths=(3, 4))
    for _ in range(2):
        for lang in languages:
            encoded = vocabulary.encode(lang, [[f"{lang}word7", f"{lang}wordy"]])
            assert encoded.composed == [[f"{lang}wordy"]]  # a word outside it, built from its n-grams
    assert len(built) == 17
    del vocabulary, vocabs, encoded
    gc.collect()
    left = sorted(key[0][2][:3] for key in subwords._TABLES if key[0][2:3] and key[0][2][:1] == "l")
    assert left == languages[-subwords._RECENT.maxlen :]


@pytest.mark.slow
def test_a_table_outlives_its_vocabulary_for_the_next_stage_of_the_run():
    """The text stage builds a language's table, LP reads the same words next: the same table,
    not another 1-3 s of building on the real text."""
    import gc
    import weakref

    from mule.mule_core import subwords

    words = ["<pad>", "<unk>", "stage", "stages", "staged"]
    first = weakref.ref(subwords.ngram_table(list(words), (3, 4)))  # nothing holds it
    gc.collect()
    assert first() is not None and subwords.ngram_table(list(words), (3, 4)) is first()
