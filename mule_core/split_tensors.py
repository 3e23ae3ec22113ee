"""One split of a dataset, ready for the model: captions as padded token rows with their
language and image, images as rows of features. What the catalog's loaders
(data_catalog.splits) build and what training and evaluation (mule_core.trainer) read."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from mule.mule_core.model import TextBatch


@dataclass
class SplitTensors:
    """One split, ready for the model. Captions are rows; images are rows of `features`."""

    languages: list[str]
    tokens: torch.Tensor  # N x T, padded
    lengths: torch.Tensor  # N
    caption_lang: np.ndarray  # N, index into languages
    caption_image: np.ndarray  # N, row of the caption's image
    image_ids: list[str]
    features: torch.Tensor | None = None  # n_images x F; None for a text-only dataset
    caption_ids: list[str] | None = None  # N, for showing the sentences behind results
    # N: captions that are translations of one another (Multi30K task1's parallel lines)
    # share a number; -1 for a caption with no translation in the split
    caption_group: np.ndarray | None = None
    # lang -> n-gram ids of the words outside its vocabulary (token ids from the
    # vocabulary's size on; mule_core.vocabulary.Vocabulary.encode); None: there are none
    unseen: dict[str, torch.Tensor] | None = None

    @property
    def n_images(self) -> int:
        return len(self.image_ids)

    def text_batch(self, rows: torch.Tensor, groups: list[tuple[str, int, int]]) -> TextBatch:
        lengths = self.lengths[rows]
        tokens = self.tokens[rows, : int(lengths.max())]
        return TextBatch(tokens, lengths, groups, self.unseen)

    def images_with(self, lang: str) -> SplitTensors:
        """The images that have a caption in `lang`, with all their captions."""
        keep_image = np.zeros(self.n_images, dtype=bool)
        keep_image[self.caption_image[self.caption_lang == self.languages.index(lang)]] = True
        return self.only_images(keep_image)

    def only_images(self, keep_image: np.ndarray) -> SplitTensors:
        """These images (a boolean mask over the image rows), in their order, with all their
        captions and nothing of the others."""
        keep_image = np.asarray(keep_image, dtype=bool)
        new_row = np.cumsum(keep_image) - 1
        rows = np.nonzero(keep_image[self.caption_image])[0]
        index = torch.from_numpy(rows)
        return SplitTensors(
            self.languages, self.tokens[index], self.lengths[index], self.caption_lang[rows],
            new_row[self.caption_image[rows]], [i for i, k in zip(self.image_ids, keep_image) if k],
            self.features[torch.from_numpy(np.nonzero(keep_image)[0])] if self.features is not None else None,
            [self.caption_ids[r] for r in rows] if self.caption_ids is not None else None,
            self.caption_group[rows] if self.caption_group is not None else None, self.unseen,
        )  # fmt: skip
