"""From the catalog to tensors: a dataset's vocabularies and word vectors, and one split's
captions (and image features) ready for the model."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable

import numpy as np
import torch

from mule.data_catalog import queries
from mule.data_catalog.tables import Catalog
from mule.mule_core.collector import bulk
from mule.mule_core.errors import InputError
from mule.mule_core.settings import ModelConfig
from mule.mule_core.split_tensors import SplitTensors
from mule.mule_core.vocabulary import Vocab, Vocabulary, pad_batch


@bulk
def load_vocabulary(catalog: Catalog, dataset: str, languages: list[str] | tuple[str, ...],
                    model: ModelConfig | None = None) -> Vocabulary:  # fmt: skip
    """The text stage's vocabularies and word vectors for these languages; for a `model`
    with subword vectors, the n-grams it composes words from and their initial vectors."""
    table = queries.word_vectors(catalog, dataset)
    langs = table["lang"].to_numpy(zero_copy_only=False)
    tokens = table["token"].to_pylist()
    flat = _matrix(table["vector"])
    out_vocabs, out_vectors, used = {}, {}, []
    for lang in languages:
        rows = np.nonzero(langs == lang)[0]
        if len(rows) == 0:
            continue
        out_vocabs[lang] = Vocab([tokens[i] for i in rows])
        out_vectors[lang] = torch.from_numpy(flat[rows].astype(np.float32))
        used.append(lang)
    if not used:
        raise InputError(f"no word vectors for {list(languages)} in dataset {dataset!r}: run the text stage first")
    lengths = tuple(model.ngram_lengths) if model is not None and model.subwords else ()
    ngrams = None
    if lengths:
        grams = queries.subword_vectors(catalog, dataset)
        gram_langs = grams["lang"].to_numpy(zero_copy_only=False)
        names, matrix = grams["ngram"].to_pylist(), _matrix(grams["vector"])
        ngrams = {}
        for lang in used:
            rows = np.nonzero(gram_langs == lang)[0]
            ngrams[lang] = ([names[i] for i in rows], torch.from_numpy(matrix[rows].astype(np.float32)))
    return Vocabulary(used, out_vocabs, out_vectors, ngrams, lengths)


def _matrix(column) -> np.ndarray:
    vectors = column.combine_chunks()
    flat = vectors.flatten().to_numpy(zero_copy_only=False)
    dim = len(vectors[0]) if len(vectors) else 0
    return flat.reshape(-1, dim) if dim else flat.reshape(0, 0)


@bulk
def load_split(
    catalog: Catalog,
    dataset: str,
    selector: str,
    vocabulary: Vocabulary,
    max_tokens: int,
    extractor: str | None = None,
    captions: str = "human",
    rewrite: Callable[[list[str]], list[str]] | None = None,
    added: tuple[str, ...] | list[str] = (),
) -> SplitTensors:
    """Captions of one split in the vocabulary's languages, as tensors.

    selector names a split (test_2016), a role (train, val, test), or "all".

    extractor: attach the image features of this extractor (the features table's
    `extractor`); images without a file or without features (and their captions) are then
    left out, and the log says how many.

    captions: "human" (the default, and always for evaluation), "human+mt" (plus the
    translate stage's captions), "mt" (English human captions, the other languages'
    replaced by machine translations).

    rewrite: what each caption's tokens become before they are encoded (query translation:
    word by word into English).

    added: languages added to a trained model whose captions are in tables of their own
    (queries.added_dataset), read beside the dataset's.
    """
    languages = vocabulary.languages
    rows = queries.caption_selection(catalog, dataset, selector, languages, captions, with_files=extractor is not None,
                                     added=added)  # fmt: skip
    if rows.num_rows == 0:
        raise InputError(f"dataset {dataset!r} has no captions in split {selector!r} for languages {languages}")
    image_col = rows["image_id"].to_pylist()
    keep = np.ones(len(image_col), dtype=bool)
    if extractor is not None:
        # Only images with features: a missing or unreadable file (in rejects) has none.
        available = catalog.extracted_image_ids(dataset, extractor)
        keep = np.asarray([bool(f) and i in available for i, f in zip(image_col, rows["has_file"].to_pylist())])
        left_out = {i for i, k in zip(image_col, keep) if not k}
        if left_out:
            logging.getLogger("mule.tasks").warning(
                "%s: %d images have no features (no file, or a file that does not decode: see the rejects "
                "table) and are left out with their %d captions", selector, len(left_out), int((~keep).sum()),
            )  # fmt: skip
    image_ids = sorted({img for img, k in zip(image_col, keep) if k})
    image_row = {img: i for i, img in enumerate(image_ids)}
    lang_index = {lang: i for i, lang in enumerate(languages)}
    lang_col, token_col, id_col = rows["lang"].to_pylist(), rows["tokens"].to_pylist(), rows["caption_id"].to_pylist()
    key_col = rows["translation_key"].to_pylist()
    if not keep.all():
        kept = np.flatnonzero(keep).tolist()
        image_col, lang_col, token_col, id_col, key_col = (
            [column[i] for i in kept] for column in (image_col, lang_col, token_col, id_col, key_col)
        )
    kept_tokens = list(map(rewrite, token_col)) if rewrite else token_col
    caption_image = list(map(image_row.__getitem__, image_col))
    caption_lang = list(map(lang_index.__getitem__, lang_col))
    caption_ids, keys = id_col, key_col
    # Each language's captions through the vocabulary's one encoding (the served model's too)
    encoded: list[list[int]] = [[] for _ in kept_tokens]
    unseen = {}
    lang_of = np.asarray(caption_lang, dtype=np.int64)
    for index, lang in enumerate(languages):
        rows_of = np.flatnonzero(lang_of == index).tolist()
        result = vocabulary.encode(lang, [kept_tokens[i] for i in rows_of])
        for i, ids in zip(rows_of, result.ids):
            encoded[i] = ids
        if result.unseen is not None:
            unseen[lang] = result.unseen
    tokens, lengths = pad_batch(encoded, max_tokens)
    matrix = None
    if extractor is not None:
        features = catalog.read_features(dataset, extractor, image_ids)
        matrix = torch.from_numpy(np.ascontiguousarray(features, dtype=np.float32))
    return SplitTensors(
        languages, tokens, lengths, np.asarray(caption_lang, np.int64), np.asarray(caption_image, np.int64), image_ids,
        matrix, caption_ids, translation_groups(keys), unseen or None,
    )  # fmt: skip


def translation_groups(keys: list[str]) -> np.ndarray:
    """A number per caption shared by the captions that translate one another (one key:
    the caption translated from); -1 for a caption whose key no other caption has."""
    counts = Counter(keys)
    numbers: dict[str, int] = {}
    return np.asarray([numbers.setdefault(key, len(numbers)) if counts[key] > 1 else -1 for key in keys], np.int64)

