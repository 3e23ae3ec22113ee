"""A trained model as a function: sentences and images in, L2-normalised vectors in the
shared space out.

One implementation for every way a model is used after training: `mule search`, `mule
serve` and the registered MLflow model (serving/mlflow_model.py). A sentence's language
is given or detected from the model's own vocabularies (a language it does not know is
never guessed); an image is a file or its bytes, run through the model's extractor (the
architecture, weights and crops named in its config).

Pure model code: whoever makes an Embedder hands it how to open an image and how to load
the extractor's network (mule.api.load does both, from files: api/from_file.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mule.mule_core.errors import UserError
from mule.mule_core.language_id import detect_language, identifier
from mule.mule_core.languages import LanguageCodeError, read_language
from mule.mule_core.model import MuleModel, TextBatch
from mule.mule_core.tokenizers import drift, tokenizer_names
from mule.mule_core.vocabulary import EncodedSentences, pad_batch, tokenize

MAX_QUERY_CHARS = 1000  # a caption is a sentence; longer text is a mistake, not a query
# A query image's pixel budget, checked from its header before anything is decoded: a
# photo of 40 MP is a large camera's; a 258 KB PNG can claim 81 MP (9000 x 9000), 2.6 s
# and nearly 1 GB to decode, which one request must not cost a shared server.
MAX_QUERY_PIXELS = 40_000_000


class EmbedError(UserError, ValueError):
    """A request the model cannot answer; `kind`: what was wrong (for HTTP status codes)."""

    def __init__(self, message: str, kind: str = "bad request"):
        super().__init__(message)
        self.kind = kind
        self.row: int | None = None


@dataclass(frozen=True)
class TextVector:
    vector: np.ndarray  # (dim,), float32, unit length
    lang: str
    language: str  # how the language was chosen: "given" or "detected: ..."
    unknown_words: list[str]  # words outside the model's vocabulary
    composed_words: list[str] = field(default_factory=list)  # of those, the ones built from their character n-grams


@dataclass
class Embedder:
    model: MuleModel
    meta: dict  # data_catalog.model_files.load_model's: vocabulary, cfg, extractor, ...
    label: str  # which model, for people
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    # device -> (the image extractor's network, a description of its weights)
    load_network: Callable[[torch.device], tuple[Any, dict]] | None = None
    # (a file or an image's bytes, shorter side wanted, pixel budget) -> a PIL image, as a
    # context manager; EmbedError for what is not a usable image or is over the budget
    open_image: Callable[[Path | bytes, int, int, int | None], Any] | None = None

    @property
    def languages(self) -> list[str]:
        return list(self.meta["vocabulary"].languages)

    @property
    def extractor(self) -> str:
        """The image extractor's name (architecture, weights, crops): features from another are meaningless here."""
        return self.meta["extractor"]

    @property
    def tokenizers(self) -> dict[str, str]:
        """lang -> the tokeniser the model's training captions were split by: the identities
        the model carries (a model from before they were stored: its text.tokenizers, and the rule)."""
        stored = self.meta.get("tokenizers")
        return tokenizer_names(stored) if stored else dict(self.meta["cfg"].text.tokenizers)

    def tokenizer_drift(self) -> dict[str, tuple[str, str]]:
        """lang -> (the tokeniser's identity trained with, the one installed here) where they differ."""
        return drift(self.meta.get("tokenizers") or {})

    @property
    def has_images(self) -> bool:
        return self.model.image_branch is not None

    def choose_language(self, text: str, lang: str | None) -> tuple[str, str]:
        """(language, how it was chosen). An unsupported or undetectable language is an error."""
        vocabs = self.meta["vocabulary"].vocabs
        if lang:
            try:  # read as everywhere else (EN, English, en-US where the model reads en)
                code, how = read_language(lang, list(vocabs))
            except LanguageCodeError as error:
                raise EmbedError(f"{self.label} does not read {lang!r}: {error}", "unknown language") from None
            return code, "given" + (f" as {lang!r}, read as {code}" if code != lang else "")
        guess = detect_language(text, vocabs, self.tokenizers)
        if guess.lang is None:
            raise EmbedError(f"none of the words of {text!r} is in the vocabulary of any language of {self.label} "
                             f"({', '.join(vocabs)}); give its language if you know it (--lang, or lang=)", "unknown words")  # fmt: skip
        return guess.lang, f"detected: {guess.describe()}"

    def _texts(self, texts: list[str], langs: list[str | None] | None = None, batch: int = 512) -> list[TextVector]:
        """Many sentences at once: each checked and its language chosen, then encoded in
        batches of one language (the pyfunc model embeds a table of captions this way).
        Words become ids as everywhere else (Vocabulary.encode: the evaluate stage's too),
        so a caption served here has the vector its evaluation measured."""
        langs = langs or [None] * len(texts)
        prepared = []
        for row, (text, lang) in enumerate(zip(texts, langs)):
            try:
                prepared.append(self._prepare(text, lang))
            except EmbedError as error:
                error.row = row  # which sentence, for a caller that reports rows
                raise
        vocabulary = self.meta["vocabulary"]
        vectors: list[TextVector | None] = [None] * len(prepared)
        max_tokens = self.meta["cfg"].text.max_tokens
        for lang in dict.fromkeys(p[0] for p in prepared):
            rows = [i for i, p in enumerate(prepared) if p[0] == lang]
            for start in range(0, len(rows), batch):
                chunk = rows[start : start + batch]
                encoded = vocabulary.encode(lang, [prepared[i][2] for i in chunk])
                for n, (i, vector) in enumerate(zip(chunk, self._vectors_of_ids(lang, encoded, max_tokens))):
                    outside_words = set(encoded.composed[n]) | set(encoded.unknown[n])
                    outside = [t for t in prepared[i][2] if t in outside_words]
                    vectors[i] = TextVector(vector, lang, prepared[i][1], outside, list(encoded.composed[n]))
        return vectors

    def _vectors_of_ids(self, lang: str, encoded: EncodedSentences, max_tokens: int) -> np.ndarray:
        """Unit vectors of sentences of one language, as word ids (Vocabulary.encode's)."""
        ids, lengths = pad_batch(encoded.ids, max_tokens)
        unseen = {lang: encoded.unseen} if encoded.unseen is not None else None
        with torch.no_grad():
            return _unit(self.model.encode_text(TextBatch(ids, lengths, [(lang, 0, len(ids))], unseen)).joint)

    def _prepare(self, text: str, lang: str | None) -> tuple[str, str, list[str]]:
        """(language, how it was chosen, tokens), or EmbedError saying what is wrong."""
        if not isinstance(text, str) or not text.strip():
            raise EmbedError("the sentence is empty", "empty")
        if len(text) > MAX_QUERY_CHARS:
            raise EmbedError(f"the sentence has {len(text):,} characters; at most {MAX_QUERY_CHARS:,}", "too large")
        lang, how = self.choose_language(text, lang)
        tokens = tokenize(text, lang, self.tokenizers)
        if not tokens:
            raise EmbedError("the sentence has no words", "empty")
        if len(self.meta["vocabulary"].encode(lang, [tokens]).unknown[0]) == len(tokens):
            raise EmbedError(f"none of the words of {text!r} ({', '.join(tokens)}) is in the {lang} vocabulary of "
                             f"{self.label}, nor shares a part with its words: nothing to search with", "unknown words")  # fmt: skip
        return lang, how, tokens

    def image_features(self, source: Path | bytes, max_pixels: int = MAX_QUERY_PIXELS) -> torch.Tensor:
        """The CNN features of an image file or its bytes, from the model's extractor: (1, dim).
        An image of more than max_pixels (from its header) is refused before decoding."""
        return self._features_of(self._crops(source, max_pixels).unsqueeze(0))

    def _crops(self, source: Path | bytes, max_pixels: int, max_bytes: int | None = None) -> torch.Tensor:
        """An image file or its bytes as the extractor's crops (crops, 3, size, size) uint8,
        opened within max_pixels and max_bytes (None: 3 bytes a pixel of the budget)."""
        from mule.mule_core.backbones import crop_transform

        if not self.has_images:
            raise EmbedError(f"{self.label} was trained without images (a text-only dataset)", "no images")
        if self.open_image is None:
            raise EmbedError(f"{self.label} was given no way to read images", "no images")
        f = self.meta["cfg"].features
        transform = crop_transform(f.input_size, f.resize, f.crops)
        with self.open_image(source, transform.shorter_side, max_pixels, max_bytes) as image:
            return transform(image)

    def _gallery_arithmetic(self):
        """A query image is extracted as the gallery's images were (the arithmetic the model's
        features were made in): bfloat16 autocast for features made on a GPU, wherever it runs."""
        made_in = self.meta.get("extractor_numerics")
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=made_in == "bfloat16-autocast")

    def warm_up(self) -> str:
        """Loads the image extractor, runs each language's encoder once and, where a query's
        language is found among several, the language identifier (0.6 s), so that a server's
        first queries do not pay for them; returns where the extractor's weights came from."""
        for lang, vocab in self.meta["vocabulary"].vocabs.items():
            known = next((t for t in vocab.tokens[2:] if t.strip()), None)
            if known:
                self.encode_text(known, lang)
        if len(self.languages) > 1:
            identifier()
        return self._warm_images()

    def _warm_images(self) -> str:
        if not self.has_images or self.load_network is None:
            return ""
        _, info = self.load_network(self.device)
        return str(info.get("weights", ""))

    # The front door's three calls (mule.api.load returns an Embedder): arrays in, arrays out.

    def encode_text(self, sentences: str | list[str], lang: str | list[str | None] | None = None,
                    details: bool = False) -> np.ndarray | list[TextVector]:  # fmt: skip
        """(n, model.joint_dim) float32 unit rows, one per sentence, as the evaluate stage and `mule
        serve` embed them. `lang`: one language for all, one per sentence, or None to
        detect each from the model's vocabularies. `details`: a TextVector per sentence
        instead (its vector, the language used and how it was chosen, the words outside
        the vocabulary), what `mule serve` shows."""
        sentences = [sentences] if isinstance(sentences, str) else list(sentences)
        langs = lang if isinstance(lang, list | tuple) else [lang] * len(sentences)
        if len(langs) != len(sentences):
            raise EmbedError(f"{len(sentences)} sentences but {len(langs)} languages")
        if not sentences:
            return [] if details else np.zeros((0, self.meta["cfg"].model.joint_dim), np.float32)
        found = self._texts(sentences, langs)
        return found if details else np.stack([v.vector for v in found])

    def preprocess(self, image: Any) -> torch.Tensor:
        """A PIL image as the extractor sees it (open_clip's `preprocess`): (crops, 3, size,
        size) uint8, the crops and size the model was trained with (the network normalises)."""
        from mule.mule_core.backbones import crop_transform

        f = self.meta["cfg"].features
        return crop_transform(f.input_size, f.resize, f.crops)(image.convert("RGB"))

    def encode_image(self, images: Path | str | bytes | torch.Tensor | list, max_pixels: int = MAX_QUERY_PIXELS,
                     max_bytes: int | None = None) -> np.ndarray:  # fmt: skip
        """(n, model.joint_dim) float32 unit rows: image files, their bytes (opened within the
        pixel budget `max_pixels`, and `max_bytes` decoded: by default 3 a pixel), or a batch
        of `preprocess`'s tensors stacked (n, crops, 3, size, size)."""
        if isinstance(images, torch.Tensor):
            if images.dim() != 5:
                raise EmbedError(f"expected preprocessed images stacked as (n, crops, 3, size, size), got {tuple(images.shape)}")
            return self._vectors_of_crops(images)
        images = [images] if isinstance(images, str | bytes | Path) else list(images)
        if not images:
            return np.zeros((0, self.meta["cfg"].model.joint_dim), np.float32)
        # one image's crops at a time: ten 448-px crops are 6 MB of pixels per image
        return np.concatenate([self._vectors_of_crops(self._crops(Path(i) if isinstance(i, str) else i, max_pixels,
                                                                  max_bytes)[None]) for i in images])  # fmt: skip

    def _vectors_of_crops(self, crops: torch.Tensor) -> np.ndarray:
        """Unit vectors of images as crops (n, crops, 3, size, size)."""
        return self.images_from_features(self._features_of(crops))

    def _features_of(self, crops: torch.Tensor) -> torch.Tensor:
        from mule.mule_core.backbones import extract

        if not self.has_images:
            raise EmbedError(f"{self.label} was trained without images (a text-only dataset)", "no images")
        if self.load_network is None:
            raise EmbedError(f"{self.label} was given no way to load its image extractor", "no images")
        network, _ = self.load_network(self.device)
        with torch.no_grad(), self._gallery_arithmetic():
            return extract(network, crops.to(self.device)).float().cpu()

    def images_from_features(self, features: torch.Tensor | np.ndarray, batch: int = 4096) -> np.ndarray:
        """Image vectors from CNN features (n, dim) of this model's extractor: (n, model.joint_dim) float32."""
        if not self.has_images:
            raise EmbedError(f"{self.label} was trained without images (a text-only dataset)", "no images")
        features = torch.as_tensor(np.ascontiguousarray(features, dtype=np.float32))
        with torch.no_grad():
            parts = [self.model.encode_image(features[s : s + batch]) for s in range(0, len(features), batch)]
        return _unit(torch.cat(parts)) if parts else np.zeros((0, self.meta["cfg"].model.joint_dim), np.float32)


def _unit(vectors: torch.Tensor) -> np.ndarray:
    vectors = torch.nn.functional.normalize(vectors.float(), dim=-1)
    return vectors.cpu().numpy().astype(np.float32)
