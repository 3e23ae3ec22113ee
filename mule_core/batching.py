"""Minibatches as in the paper: a batch is a set of images, and for each image up to
n_lang of its sentences in each language (Multi30K: 2 for en/de, 1 for fr/cs).

All sampling is vectorised numpy on the host; a batch carries the index tensors the
losses need (which image each sentence belongs to, the same-image sentence pairs), so
training never asks the device which rows belong together.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class Batch:
    images: torch.Tensor  # B, image rows in the split (into its features)
    captions: torch.Tensor  # S, caption rows in the split, grouped by language
    groups: list[tuple[str, int, int]]  # (lang, start, end) over `captions`
    sentence_image: torch.Tensor  # S, row of each sentence's image in `images` (0..B-1)
    sentence_lang: torch.Tensor  # S, language index
    same_image_pairs: tuple[torch.Tensor, torch.Tensor]  # (a, p), a != p, same image, both orders
    # S, one id per distinct sentence (language and words): identical sentences of other
    # images are no negatives (see duplicate_ids); None when not asked for
    sentence_text: torch.Tensor | None = None


def duplicate_ids(tokens: torch.Tensor, lengths: torch.Tensor, caption_lang: np.ndarray) -> np.ndarray:
    """One id per distinct sentence: captions with the same language and the same words
    share it. Many images have a caption word for word like another image's ("A dog runs
    on the grass."); such a caption is no negative for the other image: no model can rank
    one copy above the other, and hardest-negative mining picks exactly those first."""
    width = int(lengths.max()) if len(lengths) else 0
    rows = np.concatenate([caption_lang[:, None].astype(np.int64), tokens[:, :width].numpy().astype(np.int64)], axis=1)
    # Rows hashed to one number, and the hash's classes checked row by row against their
    # first member: exact, and 0.1 s on the real text where np.unique(axis=0) took 2 s.
    # The ids are only compared for equality (the losses rank them afresh).
    weights = np.random.default_rng(0).integers(1, 2**62, size=rows.shape[1], dtype=np.int64)
    _, first, inverse = np.unique((rows * weights).sum(1), return_index=True, return_inverse=True)
    inverse = inverse.reshape(-1)
    if not (rows == rows[first[inverse]]).all():  # two sentences with one hash: the slow way
        inverse = np.unique(rows, axis=0, return_inverse=True)[1].reshape(-1)
    return inverse.astype(np.int64)


def default_sentences_per_image(
    caption_image: np.ndarray, caption_lang: np.ndarray, languages: Sequence[str], many: int = 2
) -> dict[str, int]:
    """`many` (the paper: 2) for languages with several captions per image on average, else 1."""
    out = {}
    for index, lang in enumerate(languages):
        images = caption_image[caption_lang == index]
        per_image = len(images) / max(len(np.unique(images)), 1)
        out[lang] = many if per_image >= 1.5 else 1
    return out


def captions_per_image(caption_image: np.ndarray, caption_lang: np.ndarray, languages: Sequence[str]) -> str:
    """Each language's captions per image as the data has them (the mean over the images
    with any), and how many a batch draws per image: 'en 2.0, es 2.0'."""
    out = []
    for index, lang in enumerate(languages):
        images = caption_image[caption_lang == index]
        out.append(f"{lang} {len(images) / max(len(np.unique(images)), 1):.1f}")
    return ", ".join(out)


def same_group_pairs(group: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """All ordered pairs (a, p), a != p, with group[a] == group[p]."""
    order = np.argsort(group, kind="stable")
    sorted_group = group[order]
    firsts, seconds = [], []
    for shift in range(1, len(group)):
        same = sorted_group[:-shift] == sorted_group[shift:]
        if not same.any():
            break  # groups are contiguous after sorting: no larger shift can match
        firsts.append(order[:-shift][same])
        seconds.append(order[shift:][same])
    if not firsts:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    a, p = np.concatenate(firsts), np.concatenate(seconds)
    return np.concatenate([a, p]), np.concatenate([p, a])


class ImageBatchSampler:
    """Shuffles the images that have captions, then fills each batch per language.

    balance_groups: images are grouped by which languages they have captions in (COCO:
    en only, en+ja, en+zh) and every batch takes the same number from each group, as the
    paper does for MSCOCO. An epoch keeps the unbalanced number of batches; small groups
    are reshuffled and reused as often as needed.
    """

    def __init__(
        self,
        caption_image: np.ndarray,
        caption_lang: np.ndarray,
        languages: Sequence[str],
        sentences_per_image: dict[str, int],
        batch_images: int,
        seed: int = 0,
        balance_groups: bool = False,
        caption_text: np.ndarray | None = None,
    ):
        self.languages = list(languages)
        self.caption_text = caption_text
        self.per_image = [sentences_per_image.get(lang, 1) for lang in self.languages]
        self.batch_images = batch_images
        self.seed = seed
        n_images = int(caption_image.max()) + 1 if len(caption_image) else 0
        # Per language, captions sorted by image with CSR offsets: image i owns
        # order[start[i]:start[i] + count[i]].
        self.order, self.start, self.count = [], [], []
        for index in range(len(self.languages)):
            rows = np.nonzero(caption_lang == index)[0]
            rows = rows[np.argsort(caption_image[rows], kind="stable")]
            count = np.bincount(caption_image[rows], minlength=n_images)
            self.order.append(rows)
            self.start.append(np.concatenate([[0], np.cumsum(count)[:-1]]))
            self.count.append(count)
        total = np.sum(self.count, axis=0) if self.count else np.zeros(0)
        self.images = np.nonzero(total > 0)[0]
        self.balance_groups = balance_groups
        # Language signature of each image: bit i set if it has captions in language i.
        signature = sum((np.asarray(c) > 0).astype(np.int64) << i for i, c in enumerate(self.count))
        self.groups = {
            int(sig): self.images[signature[self.images] == sig] for sig in np.unique(signature[self.images])
        }

    def group_names(self) -> dict[int, str]:
        return {sig: "+".join(lang for i, lang in enumerate(self.languages) if sig >> i & 1) for sig in self.groups}

    def __len__(self) -> int:
        return -(-len(self.images) // self.batch_images)

    def _pick(self, index: int, images: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """Up to n distinct captions per image in one language -> (caption rows, batch image rows)."""
        n = self.per_image[index]
        count = self.count[index][images]
        width = int(count.max(initial=0))
        if width == 0:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        keys = rng.random((len(images), width))
        keys[np.arange(width)[None, :] >= count[:, None]] = np.inf
        choice = np.argsort(keys, axis=1)[:, :n]
        take = np.arange(choice.shape[1])[None, :] < np.minimum(count, n)[:, None]
        local = np.broadcast_to(np.arange(len(images))[:, None], choice.shape)[take]
        rows = self.order[index][(self.start[index][images][:, None] + choice)[take]]
        return rows, local

    def batches(self, epoch: int) -> Iterator[Batch]:
        rng = np.random.default_rng([self.seed, epoch])
        if self.balance_groups and len(self.groups) > 1:
            yield from self._balanced(rng)
            return
        permuted = rng.permutation(self.images)
        for begin in range(0, len(permuted), self.batch_images):
            yield self.make_batch(permuted[begin : begin + self.batch_images], rng)

    def _balanced(self, rng: np.random.Generator) -> Iterator[Batch]:
        streams = {sig: [] for sig in self.groups}

        def take(sig: int, n: int) -> list[int]:
            out = []
            while len(out) < n:
                if not streams[sig]:
                    streams[sig] = list(rng.permutation(self.groups[sig]))
                out.append(streams[sig].pop())
            return out

        per_group = max(1, self.batch_images // len(self.groups))
        for _ in range(len(self)):
            chosen = [i for sig in self.groups for i in take(sig, per_group)]
            # An image may come twice when its group is smaller than its share; keep it once.
            yield self.make_batch(np.unique(np.asarray(chosen)), rng)

    def make_batch(self, images: np.ndarray, rng: np.random.Generator) -> Batch:
        captions, sentence_image, sentence_lang, groups = [], [], [], []
        offset = 0
        for index, lang in enumerate(self.languages):
            rows, local = self._pick(index, images, rng)
            if len(rows) == 0:
                continue
            captions.append(rows)
            sentence_image.append(local)
            sentence_lang.append(np.full(len(rows), index))
            groups.append((lang, offset, offset + len(rows)))
            offset += len(rows)
        sentence_image_np = np.concatenate(sentence_image)
        a, p = same_group_pairs(sentence_image_np)
        return Batch(
            images=torch.from_numpy(np.asarray(images, dtype=np.int64)),
            captions=torch.from_numpy(np.concatenate(captions).astype(np.int64)),
            groups=groups,
            sentence_image=torch.from_numpy(sentence_image_np.astype(np.int64)),
            sentence_lang=torch.from_numpy(np.concatenate(sentence_lang).astype(np.int64)),
            same_image_pairs=(torch.from_numpy(a.astype(np.int64)), torch.from_numpy(p.astype(np.int64))),
            sentence_text=None
            if self.caption_text is None
            else torch.from_numpy(self.caption_text[np.concatenate(captions)]),
        )
