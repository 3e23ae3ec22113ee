"""Minibatches as in the paper: a set of images, n sentences per image and language."""

import numpy as np

from mule.mule_core.batching import ImageBatchSampler, captions_per_image, default_sentences_per_image, same_group_pairs

# 4 images. en: 5 captions each; de: 5 each except image 3 (none); fr: 1 each.
LANGS = ["en", "de", "fr"]
rows = [(img, 0) for img in range(4) for _ in range(5)] + [(img, 1) for img in range(3) for _ in range(5)]
rows += [(img, 2) for img in range(4)]
CAPTION_IMAGE = np.array([r[0] for r in rows])
CAPTION_LANG = np.array([r[1] for r in rows])


def sampler(batch_images=4, per_image=None):
    per_image = per_image or default_sentences_per_image(CAPTION_IMAGE, CAPTION_LANG, LANGS)
    return ImageBatchSampler(CAPTION_IMAGE, CAPTION_LANG, LANGS, per_image, batch_images, seed=1)


def test_default_counts_follow_captions_per_image():
    assert default_sentences_per_image(CAPTION_IMAGE, CAPTION_LANG, LANGS) == {"en": 2, "de": 2, "fr": 1}


def test_captions_per_image_are_the_data_s_not_what_a_batch_draws():
    # en 5 on each of 4 images, de 5 on each of the 3 it has, fr 1 each: the log said {'en': 2, 'de': 2, ...}
    assert captions_per_image(CAPTION_IMAGE, CAPTION_LANG, LANGS) == "en 5.0, de 5.0, fr 1.0"


def test_batch_counts_per_language_and_image():
    batch = next(sampler().batches(epoch=1))
    assert sorted(batch.images.tolist()) == [0, 1, 2, 3]
    langs = [LANGS[i] for i in batch.sentence_lang.tolist()]
    assert langs.count("en") == 8 and langs.count("de") == 6 and langs.count("fr") == 4  # image 3 has no de
    for local, image in enumerate(batch.images.tolist()):
        mine = batch.sentence_image == local
        assert (CAPTION_IMAGE[batch.captions[mine].numpy()] == image).all()  # every sentence is its image's
        assert len(set(batch.captions[mine].tolist())) == int(mine.sum())  # distinct captions


def test_groups_are_contiguous_by_language():
    batch = next(sampler().batches(epoch=1))
    for lang, start, end in batch.groups:
        assert set(CAPTION_LANG[batch.captions[start:end].numpy()]) == {LANGS.index(lang)}
    assert batch.groups[-1][2] == len(batch.captions)


def test_same_image_pairs_are_exactly_the_positives():
    batch = next(sampler().batches(epoch=1))
    a, p = batch.same_image_pairs
    pairs = set(zip(a.tolist(), p.tolist()))
    img = batch.sentence_image.tolist()
    expected = {(i, j) for i in range(len(img)) for j in range(len(img)) if i != j and img[i] == img[j]}
    assert pairs == expected


def test_same_group_pairs_small_case():
    a, p = same_group_pairs(np.array([7, 3, 7, 7]))
    assert sorted(zip(a.tolist(), p.tolist())) == [(0, 2), (0, 3), (2, 0), (2, 3), (3, 0), (3, 2)]


def test_an_epoch_visits_every_image_once_and_epochs_differ():
    s = sampler(batch_images=3)
    first = [b.images.tolist() for b in s.batches(epoch=1)]
    assert sorted(sum(first, [])) == [0, 1, 2, 3] and len(first) == len(s) == 2
    second = [b.images.tolist() for b in s.batches(epoch=2)]
    again = [b.images.tolist() for b in s.batches(epoch=1)]
    assert again == first  # reproducible
    assert second != first or [b.captions.tolist() for b in s.batches(2)] != [b.captions.tolist() for b in s.batches(1)]


def test_override_sentences_per_image():
    batch = next(sampler(per_image={"en": 1, "de": 3, "fr": 1}).batches(epoch=1))
    langs = [LANGS[i] for i in batch.sentence_lang.tolist()]
    assert langs.count("en") == 4 and langs.count("de") == 9


def coco_like():
    """30 images with en only, 6 with en+ja, 3 with en+zh (5 en captions each, 5 ja / 1 zh)."""
    rows = []
    for img in range(39):
        rows += [(img, 0)] * 5
        if 30 <= img < 36:
            rows += [(img, 1)] * 5
        if img >= 36:
            rows += [(img, 2)]
    return np.array([r[0] for r in rows]), np.array([r[1] for r in rows])


def test_language_groups_come_from_the_data():
    image, lang = coco_like()
    s = ImageBatchSampler(image, lang, ["en", "ja", "zh"], {"en": 2, "ja": 2, "zh": 1}, 9, balance_groups=True)
    assert sorted(s.group_names().values()) == ["en", "en+ja", "en+zh"]
    assert {name: len(s.groups[sig]) for sig, name in s.group_names().items()} == {"en": 30, "en+ja": 6, "en+zh": 3}


def test_balanced_batches_draw_equally_from_each_group():
    image, lang = coco_like()
    s = ImageBatchSampler(image, lang, ["en", "ja", "zh"], {"en": 2, "ja": 2, "zh": 1}, 9, seed=2, balance_groups=True)
    batches = list(s.batches(epoch=1))
    assert len(batches) == len(s) == 5  # as many batches as without balancing
    for batch in batches:
        ids = batch.images.numpy()
        assert (ids < 30).sum() == 3 and ((ids >= 30) & (ids < 36)).sum() == 3 and (ids >= 36).sum() == 3
    unbalanced = ImageBatchSampler(image, lang, ["en", "ja", "zh"], {}, 9, seed=2)
    first = next(unbalanced.batches(1)).images.numpy()
    assert (first < 30).sum() > 3  # without balancing, en-only images dominate
