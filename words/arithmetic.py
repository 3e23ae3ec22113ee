"""A language's branch started aligned with a trained model's, from a multilingual encoder's
word vectors: the arithmetic (numpy and torch only; where the vectors come from is the
caller's: words/aligned.py).

    features = neighbour_mix(new_words, trained_words, their_mule_features)  # a translation by neighbours
    ngrams = fit_ngram_means(index, vectors, rows)   # so an unseen word composes among those spelled like it
"""

from __future__ import annotations

import numpy as np
import torch


def fit_ngram_means(index: torch.Tensor, targets: torch.Tensor, rows: int, strength: float = 0.1,
                    iterations: int = 60) -> torch.Tensor:  # fmt: skip
    """N-gram vectors (`rows` of them, row 0 the padding) whose mean over each vocabulary
    word's n-grams (`index`: a row of n-gram ids per word, 0-padded) is as near the word's
    target vector as one shared table allows: ridge least squares, |A T - Y|^2 + strength
    |T|^2 with A the words' n-gram means, solved by conjugate gradients on sparse products.
    A linear Mimick (Pinter et al., 2017): n-grams shared by words of every meaning ("<a",
    "o>") end up small and the telling ones carry the meaning, so a word outside the
    vocabulary, the mean of its n-grams, lands among the words spelled like it."""
    words, width = index.shape
    held = index.reshape(-1).long()
    owner = torch.arange(words).repeat_interleave(width)
    keep = held > 0
    held, owner = held[keep], owner[keep]
    count = torch.zeros(words).index_add_(0, owner, torch.ones(len(owner)))
    values = 1.0 / count[owner]
    a = torch.sparse_coo_tensor(torch.stack([owner, held]), values, (words, rows), check_invariants=True).coalesce()
    at = torch.sparse_coo_tensor(torch.stack([held, owner]), values, (rows, words), check_invariants=True).coalesce()
    y = targets.to(torch.float32) * (count > 0)[:, None]

    def normal(t: torch.Tensor) -> torch.Tensor:
        return torch.sparse.mm(at, torch.sparse.mm(a, t)) + strength * t

    # conjugate gradients, every column at once (each column its own step sizes)
    table = torch.zeros(rows, targets.shape[1])
    residual = torch.sparse.mm(at, y)
    direction = residual.clone()
    norm = (residual * residual).sum(0)
    for _ in range(iterations):
        product = normal(direction)
        step = norm / (direction * product).sum(0).clamp(min=1e-20)
        table += step * direction
        residual -= step * product
        new_norm = (residual * residual).sum(0)
        if float(new_norm.max()) < 1e-10:
            break
        direction = residual + (new_norm / norm.clamp(min=1e-20)) * direction
        norm = new_norm
    table[0].zero_()
    return table.to(targets.dtype)


def neighbour_mix(queries: np.ndarray, keys: np.ndarray, values: np.ndarray, k: int = 5,
                  temperature: float = 0.05, chunk: int = 4096) -> np.ndarray:  # fmt: skip
    """Per query row, the softmax-weighted mean of the `values` of its `k` nearest `keys`
    by cosine (a word read as its nearest words of another language: a translation by
    neighbours, with the weights sharpened by `temperature`)."""
    q = torch.from_numpy(queries).float()
    q = q / q.norm(dim=1, keepdim=True).clamp(min=1e-12)
    keys_t = torch.from_numpy(keys).float()
    keys_t = keys_t / keys_t.norm(dim=1, keepdim=True).clamp(min=1e-12)
    values_t = torch.from_numpy(values).float()
    out = torch.empty(len(q), values_t.shape[1])
    for start in range(0, len(q), chunk):
        scores, nearest = (q[start : start + chunk] @ keys_t.T).topk(min(k, len(keys_t)), dim=1)
        weights = torch.softmax(scores / temperature, dim=1)
        out[start : start + chunk] = (weights[..., None] * values_t[nearest]).sum(1)
    return out.numpy()


def nearest(queries: np.ndarray, keys: np.ndarray, chunk: int = 4096) -> tuple[np.ndarray, np.ndarray]:
    """(index of each query's nearest key by cosine, that cosine)."""
    q = torch.from_numpy(queries).float()
    q = q / q.norm(dim=1, keepdim=True).clamp(min=1e-12)
    keys_t = torch.from_numpy(keys).float()
    keys_t = keys_t / keys_t.norm(dim=1, keepdim=True).clamp(min=1e-12)
    index, score = torch.empty(len(q), dtype=torch.long), torch.empty(len(q))
    for start in range(0, len(q), chunk):
        score[start : start + chunk], index[start : start + chunk] = (q[start : start + chunk] @ keys_t.T).max(1)
    return index.numpy(), score.numpy()
