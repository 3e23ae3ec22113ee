"""A language added to a trained model starts aligned with it (add.start=aligned):
its words are its captions' and its commonest words (wordfreq's list, offline: none of them
needs a caption), and each word starts at the MULE feature of its nearest words among the
trained languages' commonest, nearness read by multilingual-e5 (each language centred on
its own commonest words, e5's vectors of one language sharing a large part that says only
which language it is). So `perro` starts where `dog` and `Hund` are before the branch has
seen a caption: with no captions the language is read zero-shot, and captions train on
from there. The branch carries those features exactly: they fill the first mule_dim
coordinates of its word vectors, and its FC into MULE starts by passing them on.

Unseen words: the branch's character n-grams are fitted (ridge least squares,
mule_core.aligned_words.fit_ngram_means) so that each word's mean of its n-grams is near its
vector, so a word outside its vocabulary is composed among the words spelled like it; serving, `mule search`, the export and the ONNX text tower
read any word that way. Words are read by e5 once per machine (words/vectors.py).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np
import torch

from mule.mule_core.errors import UserError
from mule.mule_core.model import MuleModel
from mule.mule_core.progress import SHOWN
from mule.mule_core.subwords import ngram_table
from mule.mule_core.vocabulary import PAD, UNK, Vocab, Vocabulary
from mule.words.arithmetic import fit_ngram_means, neighbour_mix
from mule.words.common import centre_words, centred, common_words
from mule.words.vectors import word_vectors

# Chosen on the validation photos by taking each trained language out in turn and starting it
# again from the others (bench/aligned_start_val.py; docs/real-photos.md): 20 neighbours at 0.1,
# and each trained language's 1,000 commonest words as the keys (fewer, better-trained words
# beat more: 1,000 read 32.6 mR held out, 10,000 27.8)
NEIGHBOURS, TEMPERATURE, FIT_WORDS = 20, 0.1, 1000


@dataclass(frozen=True)
class StartSettings:
    """How a language starts aligned. open_words: wordfreq's commonest words of the language
    (add.words); fit_words: each trained language's commonest words, the keys its words are
    read from and what its FC is fitted on; word_dim: the branch's word width (None: mule_dim,
    the MULE feature itself, nothing more)."""

    open_words: int = 50_000
    fit_words: int = FIT_WORDS
    neighbours: int = NEIGHBOURS
    temperature: float = TEMPERATURE
    word_dim: int | None = None


@dataclass
class AlignedStart:
    vocab: Vocab
    vectors: torch.Tensor  # one per vocabulary row (word_dim)
    ngrams: tuple[list[str], torch.Tensor] | None  # the branch's n-grams and their fitted vectors
    fc_weight: torch.Tensor
    fc_bias: torch.Tensor
    summary: dict = field(default_factory=dict)


def _mule_features(model: MuleModel, lang: str, rows: int) -> np.ndarray:
    """The MULE features of a trained language's first `rows` vocabulary words (its commonest, after <pad>, <unk>)."""
    ids = torch.arange(2, 2 + rows)
    with torch.no_grad():
        features, _ = model.branches[lang].distinct_features(ids)
    return features.float().numpy()


def aligned_start(model: MuleModel, vocabulary: Vocabulary, lang: str, caption_words: list[str],
                  settings: StartSettings = StartSettings(), tokenizers: dict[str, str] | None = None,
                  keys_from: list[str] | None = None) -> AlignedStart:  # fmt: skip
    """The start of `lang`'s branch on `model` (its trained languages' vocabularies in
    `vocabulary`): the vocabulary (caption words first, then the commonest words), its word
    vectors in the shared space, fitted n-grams, and the FC into MULE fitted on the trained
    languages' commonest words. `keys_from`: the languages whose words are the keys (default:
    every other language of the model; a language added before is not one whose rows are
    ordered by how often its captions use them)."""
    log = logging.getLogger("mule.words")
    open_words, fit_words = settings.open_words, settings.fit_words
    neighbours, temperature = settings.neighbours, settings.temperature
    trained = [x for x in (keys_from or model.languages) if x != lang]
    mule_dim = next(iter(model.branches.values())).fc.out_features
    word_dim = settings.word_dim or mule_dim
    common = common_words(lang, open_words, tokenizers)
    tokens = list(dict.fromkeys([PAD, UNK, *(w for w in caption_words if w not in (PAD, UNK)), *common]))
    if len(tokens) == 2:
        raise UserError(f"no words to start {lang} from: it has no captions and wordfreq lists none of its words; "
                        "give it captions (data.extra_captions), or use add.start=captions")  # fmt: skip
    fitted = {x: vocabulary.vocabs[x].tokens[2 : 2 + fit_words] for x in trained}
    centres = {x: centre_words(x, tokenizers) for x in [*trained, lang]}
    log.info("%s: starting aligned with %s: %d words (%d from its captions, %d of wordfreq's commonest), each read "
             "as its %d nearest words of theirs (%s)", lang, ", ".join(trained), len(tokens) - 2, len(caption_words),
             len(common), neighbours, "+".join(str(len(w)) for w in fitted.values()), extra=SHOWN)  # fmt: skip
    every = list(dict.fromkeys([w for x in trained for w in fitted[x]] + [w for ws in centres.values() for w in ws]
                               + tokens[2:]))  # fmt: skip
    read = dict(zip(every, word_vectors(every, f"e5 words ({lang} and its base)", logger=log)))

    def matrix(words: list[str]) -> np.ndarray:
        return np.stack([read[w] for w in words]) if words else np.zeros((0, 384), np.float32)

    # each word's MULE feature: its nearest trained words' (in e5, each language centred), a translation by neighbours
    keys = np.concatenate([centred(matrix(fitted[x]), matrix(centres[x])) for x in trained])
    features = np.concatenate([_mule_features(model, x, len(fitted[x])) for x in trained])
    mixed = neighbour_mix(centred(matrix(tokens[2:]), matrix(centres[lang])), keys, features, neighbours, temperature)
    vectors, (weight, bias) = _carrying(mixed, word_dim)
    ngrams = None
    if vocabulary.ngram_lengths:
        table = ngram_table(tokens, vocabulary.ngram_lengths)
        fitted_grams = fit_ngram_means(table.index.long(), torch.from_numpy(vectors), len(table) + 1)
        ngrams = (table.ngrams, fitted_grams[1:])
    return AlignedStart(Vocab(tokens), torch.from_numpy(vectors), ngrams, torch.from_numpy(weight),
                        torch.from_numpy(bias), {"words": len(tokens) - 2, "caption_words": len(caption_words),
                                                 "common_words": len(common), "neighbours": neighbours,
                                                 "temperature": temperature,
                                                 "key_words": {x: len(w) for x, w in fitted.items()}})  # fmt: skip


def _carrying(features: np.ndarray, word_dim: int) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray]]:
    """Word vectors and an FC into MULE that give each word its MULE feature: with word_dim >=
    mule_dim exactly (the feature in the vectors' first mule_dim coordinates, an FC that
    passes them on); with fewer word dimensions, its part along the features' word_dim
    principal axes (the FC those axes, its bias their mean). <pad> and <unk> start at zero."""
    rows, mule_dim = features.shape
    vectors = np.zeros((rows + 2, word_dim), np.float32)
    if mule_dim <= word_dim:
        vectors[2:, :mule_dim] = features
        weight = np.zeros((mule_dim, word_dim), np.float32)
        weight[:, :mule_dim] = np.eye(mule_dim, dtype=np.float32)
        return vectors, (weight, np.zeros(mule_dim, np.float32))
    centre = features.mean(0)
    _, _, axes = np.linalg.svd(features - centre, full_matrices=False)
    basis = axes[:word_dim].T.astype(np.float32)  # mule_dim x word_dim
    vectors[2:] = (features - centre) @ basis
    return vectors, (basis, centre.astype(np.float32))
