"""An Embedder whose towers run under ONNX Runtime (mule_core.onnx_towers' graphs): the same
calls and checks as the PyTorch one (language chosen, words outside the vocabulary
composed or refused, images opened within their budget), the numbers from the ONNX files.

    embedder = OnnxEmbedder(model, meta, label, text=OnnxSession(...), image=OnnxSession(...))

`model` is kept for what is not a tower's: its languages and settings; it computes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from mule.mule_core.embedder import Embedder, EmbedError
from mule.mule_core.onnx_towers import OnnxSession, layout, text_inputs
from mule.mule_core.vocabulary import EncodedSentences

TEXT_CHUNK = 64


@dataclass
class OnnxEmbedder(Embedder):
    text: OnnxSession | None = None
    image: OnnxSession | None = None  # None: a model without images, or a folder without the image tower
    int8: bool = False  # the towers' 8-bit variants: vectors of their own (a store tells them apart)

    def __post_init__(self):
        self._layout = layout(self.model)

    def _vectors_of_ids(self, lang: str, encoded: EncodedSentences, max_tokens: int) -> np.ndarray:
        vocabulary = self.meta["vocabulary"]
        index = vocabulary.vocabs[lang].ngrams(vocabulary.ngram_lengths).index if vocabulary.ngram_lengths else None
        inputs = text_inputs(self._layout, lang, encoded, index, max_tokens)
        # in chunks: the n-gram lookup holds sentences x words x n-grams x dim floats at once
        return np.concatenate([self.text({k: v[s : s + TEXT_CHUNK] for k, v in inputs.items()})
                               for s in range(0, len(inputs["lang"]), TEXT_CHUNK)])  # fmt: skip

    def _vectors_of_crops(self, crops: torch.Tensor) -> np.ndarray:
        if not self.has_images:
            raise EmbedError(f"{self.label} was trained without images (a text-only dataset)", "no images")
        if self.image is None:
            raise EmbedError(f"{self.label} has no ONNX image tower (exported without its extractor's weights)", "no images")
        return self.image({"crops": np.ascontiguousarray(crops.numpy(), dtype=np.uint8)})

    def images_from_features(self, features, batch: int = 4096) -> np.ndarray:
        raise EmbedError(f"{self.label} runs its ONNX image tower, which takes images, not CNN features: "
                         "load it with engine='torch' to embed a gallery's features")  # fmt: skip

    def image_features(self, source, max_pixels: int = 0):
        raise EmbedError(f"{self.label} runs its ONNX image tower, which gives vectors, not CNN features: "
                         "load it with engine='torch' for the extractor's features")  # fmt: skip

    def _warm_images(self) -> str:
        return "ONNX image tower" if self.image is not None else ""
