"""The arithmetic of an aligned start (words/arithmetic.py), on cases checked by hand."""

import numpy as np
import torch

from mule.mule_core.subwords import ngram_table
from mule.words.arithmetic import fit_ngram_means, neighbour_mix


def test_a_word_is_read_as_the_softmax_weighted_mean_of_its_nearest_keys_values():
    """Keys at angles 0, 90 and 180 degrees; a query at 10 degrees has key 0 nearest, then
    key 1: with k=2 its value is the mix of those two, weighted by exp(cos / t); k=1 gives key 0's."""
    keys = np.array([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]])
    values = np.array([[10.0], [20.0], [30.0]])
    query = np.array([[np.cos(np.radians(10)), np.sin(np.radians(10))]]) * 3.0  # its length does not matter
    assert neighbour_mix(query, keys, values, k=1)[0, 0] == 10.0
    scores = np.array([np.cos(np.radians(10)), np.cos(np.radians(80))])
    weights = np.exp(scores / 0.5) / np.exp(scores / 0.5).sum()
    assert np.isclose(neighbour_mix(query, keys, values, k=2, temperature=0.5)[0, 0], weights @ [10.0, 20.0], atol=1e-5)


def test_fitted_ngrams_compose_an_unseen_word_near_the_words_it_is_spelled_like():
    """Words ending in -ing share a target, words ending in -ed another: the fitted n-grams
    compose each vocabulary word near its target, and an unseen word ending in -ing near the
    first, not the second."""
    words = ["<pad>", "<unk>", "walking", "talking", "singing", "jumping", "walked", "talked", "jumped", "played"]
    table = ngram_table(words, (3, 4, 5))
    targets = torch.zeros(len(words), 2)
    targets[2:6, 0] = 1.0  # the -ing words
    targets[6:, 1] = 1.0  # the -ed words
    fitted = fit_ngram_means(table.index.long(), targets, len(table) + 1, strength=1e-4, iterations=200)
    composed = fitted[table.rows(["dancing"]).long()[0]]
    composed = composed[table.rows(["dancing"])[0] > 0].mean(0)
    assert composed[0] > 0.5 and composed[1] < 0.25, composed
    means = (fitted[table.index.long()] * (table.index > 0)[..., None]).sum(1) / (table.index > 0).sum(1).clamp(min=1)[:, None]
    assert torch.equal(means[2:].argmax(1), targets[2:].argmax(1))  # each vocabulary word nearer its own target
    assert torch.equal(fitted[0], torch.zeros(2))  # the padding row


def test_a_part_of_the_e5_word_cache_that_cannot_be_read_is_removed_said_and_read_again(tmp_path, monkeypatch, caplog):
    """What a power cut leaves in the cache (an empty part, a truncated one, one of other
    content) is removed with one line each; the words of the good part come from it alone,
    and a word only a damaged part held is read again by the encoder."""
    from mule.words import encoder as e5_vectors
    from mule.words import vectors as e5_words

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    folder = tmp_path / "mule" / f"e5-words-{e5_vectors.encoder_version().replace(' ', '-')}"
    e5_words._write_part(folder, ["perro", "gato"], np.eye(2, 384, dtype=np.float16))
    e5_words._write_part(folder, ["caballo"], np.ones((1, 384), np.float16))
    good, lost = sorted(folder.glob("part-*.npz"))
    lost.write_bytes(lost.read_bytes()[:40])  # truncated
    (folder / "part-0-empty.npz").write_bytes(b"")
    np.savez(folder / "part-1-other.npz", words=np.arange(3), vectors=np.zeros((3, 2)))  # the right shape, wrong content
    read = []

    class Encoder:
        def query(self, words):
            read.extend(words)
            return np.full((len(words), 384), 0.5, np.float32)

    monkeypatch.setattr(e5_vectors, "load_encoder", lambda: Encoder())
    vectors = e5_words.word_vectors(["perro", "gato", "caballo"])
    assert read == ["caballo"]  # only the word the damaged part held is read again
    assert vectors[0, 0] == 1.0 and vectors[1, 1] == 1.0 and np.allclose(vectors[2], 0.5, atol=1e-3)
    said = [r.getMessage() for r in caplog.records if "e5 word cache" in r.getMessage()]
    assert len(said) == 3 and all("removed, its words are read again" in line for line in said)
    assert good.exists() and not lost.exists() and not (folder / "part-0-empty.npz").exists()
    assert e5_words.word_vectors(["caballo"])[0, 0] == np.float16(0.5) and read == ["caballo"]  # cached again
