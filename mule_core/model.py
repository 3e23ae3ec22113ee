"""The MULE model.

    words (per language) --embedding--> --FC (per language)--> MULE word features (M)
        (with model.subwords, a word's embedding is its own vector plus the mean of its
        character n-grams' vectors, and a word outside the vocabulary the mean of its
        n-grams' alone: mule_core/subwords.py)
        mean over words                  -> MULE sentence vector (LP, NC, language classifier)
        shared LSTM, last hidden, FC     -> sentence embedding in the multimodal space (D)
    image features --FC-BN-ReLU-FC-->    -> image embedding in the multimodal space (D)

Embeddings in the multimodal space are L2-normalised, so a dot product is the cosine
similarity. Each language owns only its word embeddings and its FC into MULE.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence

from mule.mule_core.subwords import SubwordVectors, gather_rows
from mule.mule_core.table_precision import check_precision, rounded

if TYPE_CHECKING:  # annotations only: a model is code of its own, not of the config's module
    from mule.mule_core.settings import ModelConfig
    from mule.mule_core.vocabulary import Vocab, Vocabulary


class _GradientReversal(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return -ctx.scale * grad, None


def grad_reverse(x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """Identity forward; multiplies the gradient by -scale on the way back."""
    return _GradientReversal.apply(x, scale)


class SentenceEncoder(nn.Module):
    """LSTM over word features, last hidden state, FC into the multimodal space, L2-normalised."""

    def __init__(self, input_dim: int, hidden: int, joint: int):
        super().__init__()
        self.lstm = nn.LSTM(input_dim, hidden, batch_first=True)
        self.fc = nn.Linear(hidden, joint)

    def forward(self, words: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        packed = pack_padded_sequence(words, lengths, batch_first=True, enforce_sorted=False)
        if words.is_cuda or not torch.is_grad_enabled():
            _, (hidden, _) = self.lstm(packed)
            last = hidden[-1]
        else:
            last = unrolled_lstm_last(self.lstm, packed)
        return F.normalize(self.fc(last), dim=-1)


def unrolled_lstm_last(lstm: nn.LSTM, packed: PackedSequence) -> torch.Tensor:
    """Last hidden state of a one-layer LSTM over a packed batch, step by step in autograd ops.

    Same parameters and result as `lstm(packed)`, for training on the CPU: there PyTorch's
    LSTM slices the packed input once per time step, and each slice's gradient is a zeroed
    copy of the whole input (O(steps x tokens) memory traffic, 45% of a demo training step).
    Here the input projection is one matmul split by time step (its gradient is one cat), and
    sequences leave the batch as they end, as in packing (the packed batch is sorted longest first).
    """
    projected = F.linear(packed.data, lstm.weight_ih_l0, lstm.bias_ih_l0 + lstm.bias_hh_l0)
    steps = projected.split(packed.batch_sizes.tolist())
    h = projected.new_zeros(steps[0].shape[0], lstm.hidden_size)
    c = torch.zeros_like(h)
    recurrent = lstm.weight_hh_l0.T
    finished = []
    for step in steps:
        active = step.shape[0]
        if active < h.shape[0]:  # the shortest sequences ended at the previous step
            finished.append(h[active:])
            h, c = h[:active], c[:active]
        i, f, g, o = torch.addmm(step, h, recurrent).chunk(4, 1)  # PyTorch's gate order
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * torch.tanh(c)
    finished.append(h)
    return torch.cat(finished[::-1])[packed.unsorted_indices]


class LanguageBranch(nn.Module):
    """One language's own parameters: word embeddings (with `ngram_lengths`, composed with
    its words' character n-grams), then either the FC into MULE (the sentence encoder after
    it is shared) or, for PARALLEL-EmbN, a sentence encoder of its own."""

    def __init__(
        self,
        vocab_size: int,
        word_dim: int,
        mule_dim: int,
        finetune: bool = True,
        encoder: SentenceEncoder | None = None,
        words: Sequence[str] | None = None,
        ngram_lengths: Sequence[int] = (),
    ):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, word_dim, padding_idx=0)
        self.embed.weight.requires_grad_(finetune)
        self.words = list(words) if words is not None else None
        self.subwords = None
        if ngram_lengths:
            if self.words is None or len(self.words) != vocab_size:
                raise ValueError("subword vectors need the vocabulary's words, one per embedding row")
            self.subwords = SubwordVectors(self.words, word_dim, ngram_lengths)
            self.subwords.vectors.weight.requires_grad_(finetune)
        self.fc = nn.Linear(word_dim, mule_dim) if encoder is None else None
        self.encoder = encoder
        # Initial vectors, for the L2 pull toward them; rebuilt from the catalog, not saved.
        self.register_buffer("initial", torch.zeros(vocab_size, word_dim), persistent=False)

    def init_vectors(self, vectors: torch.Tensor, ngrams: tuple[list[str], torch.Tensor] | None = None) -> None:
        """Starts every word at `vectors` (one row per vocabulary word). With subword
        vectors, the n-grams start at the word-vector model's (`ngrams`: names and vectors;
        zero without) and each word's own vector at what makes its composition the given one."""
        with torch.no_grad():
            own = vectors.to(self.embed.weight.dtype)
            if self.subwords is not None:
                self.subwords.set_initial(*(ngrams or ([], vectors[:0])))
                own = own - self.subwords.mean(self.subwords.index)
            self.embed.weight.copy_(own)
            self.embed.weight[0].zero_()
            self.initial.copy_(self.embed.weight)

    def drift(self, rows: torch.Tensor | None = None) -> torch.Tensor:
        """Squared distance of the word vectors from their initial values: of every row, or
        of `rows` alone (read through the embedding: a sparse gradient when it gives those)."""
        if rows is None:
            return (self.embed.weight - self.initial).pow(2).sum()
        rows = rows[rows < self.embed.num_embeddings]  # words outside the vocabulary have no row
        return (self.embed(rows) - self.initial.index_select(0, rows)).pow(2).sum()

    def word_parameters(self) -> list[nn.Parameter]:
        """What the word learning rate (train.word_lr_scale) applies to."""
        return [self.embed.weight] + ([self.subwords.vectors.weight] if self.subwords is not None else [])

    def word_vectors(self, tokens: torch.Tensor, unseen: torch.Tensor | None = None) -> torch.Tensor:
        """Vectors of word ids (mule_core.vocabulary.Vocabulary.encode's): vocabulary rows, and from
        the vocabulary's size on, words outside it composed from their n-grams (`unseen`)."""
        return self.embed(tokens) if self.subwords is None else self.subwords.compose(self.embed, tokens, unseen)

    def forward(self, tokens: torch.Tensor, unseen: torch.Tensor | None = None) -> torch.Tensor:
        """Word features: MULE word features, or plain word vectors without a MULE layer."""
        if self.fc is None:
            return self.word_vectors(tokens, unseen)
        rows, inverse = self.distinct_features(tokens, unseen)
        return gather_rows(rows, inverse, tokens.shape)

    def distinct_features(self, tokens: torch.Tensor, unseen: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(MULE word features of the batch's distinct words, each token's row among them).

        The FC into MULE runs once per distinct word, not per token: an LP batch holds ~40k
        tokens of a few thousand distinct words (the FC on every token was a sixth of an LP
        step on the demo). Token id 0 (padding), when present, is row 0."""
        unique, inverse = tokens.unique(return_inverse=True)
        words = self.embed(unique) if self.subwords is None else self.subwords.compose_distinct(self.embed, unique, unseen)
        return self.fc(words), inverse

@dataclass
class TextBatch:
    """Sentences grouped by language: rows groups[i][1]:groups[i][2] are in language groups[i][0].

    lengths stay on the CPU (packing needs them there); keeping the groups on the host
    means no device-to-host sync to route sentences to their language branch.
    """

    tokens: torch.Tensor  # N x T
    lengths: torch.Tensor  # N, CPU
    groups: list[tuple[str, int, int]]
    # lang -> n-gram ids of the words outside its vocabulary that `tokens` name (ids from
    # the vocabulary's size on: mule_core.vocabulary.Vocabulary.encode); None: every word is in it
    unseen: dict[str, torch.Tensor] | None = None

    def to(self, device: torch.device) -> TextBatch:
        unseen = {k: v.to(device, non_blocking=True) for k, v in self.unseen.items()} if self.unseen else self.unseen
        return TextBatch(self.tokens.to(device, non_blocking=True), self.lengths, self.groups, unseen)

    def unseen_of(self, lang: str) -> torch.Tensor | None:
        return self.unseen.get(lang) if self.unseen else None


def _mean_of_words(rows: torch.Tensor, inverse: torch.Tensor, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """The mean of each sentence's word features over its `lengths` first tokens (the rest
    pad): a weighted sum of the distinct words' rows, never the tokens x features tensor."""
    valid = torch.arange(tokens.shape[1])[None, :] < lengths[:, None]
    weights = (valid / lengths[:, None].clamp(min=1)).to(device=rows.device, dtype=rows.dtype)
    return F.embedding_bag(inverse.reshape(tokens.shape), rows, mode="sum", per_sample_weights=weights)


@dataclass
class TextEncoding:
    mule: torch.Tensor | None  # N x M, mean of MULE word features (not normalised); None without MULE
    joint: torch.Tensor | None  # N x D, L2-normalised


SHARING = ("mule", "parallel")


class MuleModel(nn.Module):
    """sharing="mule": per-language embeddings + FC into MULE, everything after shared.
    sharing="parallel" (PARALLEL-EmbN; with one language, EmbN): each language has its own
    embeddings and sentence encoder; only the image branch is shared.

    words: each language's vocabulary (its words in embedding-row order); needed with
    model.subwords, whose n-gram tables are built from them."""

    def __init__(
        self,
        languages: Sequence[str],
        vocab_sizes: dict[str, int],
        word_dim: int | Mapping[str, int],
        image_dim: int | None,
        cfg: ModelConfig,
        words: dict[str, Sequence[str]] | None = None,
    ):
        super().__init__()
        # one word width for every language, or each its own (a language added from an
        # aligned start needs only mule_dim: with_added_language)
        dims = dict(word_dim) if isinstance(word_dim, Mapping) else {lang: word_dim for lang in languages}
        if cfg.sharing not in SHARING:
            raise ValueError(f"model.sharing must be one of {SHARING}, got {cfg.sharing!r}")
        if cfg.subwords and (words is None or any(lang not in words for lang in languages)):
            raise ValueError("model.subwords needs every language's words (the vocabulary), to build its n-grams")
        ngram_lengths = tuple(cfg.ngram_lengths) if cfg.subwords else ()
        self.sharing = cfg.sharing
        self.languages = list(languages)
        self.lang_index = {lang: i for i, lang in enumerate(self.languages)}
        parallel = cfg.sharing == "parallel"
        self.branches = nn.ModuleDict(
            {
                lang: LanguageBranch(
                    vocab_sizes[lang],
                    dims[lang],
                    cfg.mule_dim,
                    cfg.finetune_words,
                    SentenceEncoder(dims[lang], cfg.lstm_dim, cfg.joint_dim) if parallel else None,
                    words[lang] if words is not None else None,
                    ngram_lengths,
                )  # fmt: skip
                for lang in languages
            }
        )
        self.encoder = None if parallel else SentenceEncoder(cfg.mule_dim, cfg.lstm_dim, cfg.joint_dim)
        # A text-only dataset (no images) still trains and evaluates the MULE layers.
        self.image_branch = (
            nn.Sequential(
                nn.Linear(image_dim, cfg.image_hidden),
                nn.BatchNorm1d(cfg.image_hidden),
                nn.ReLU(inplace=True),
                nn.Linear(cfg.image_hidden, cfg.joint_dim),
            )
            if image_dim
            else None
        )
        self.classifier = None if parallel else nn.Linear(cfg.mule_dim, len(self.languages))
        # CNN features are standardised with the training set's statistics (saved with the
        # model): raw pooled ResNet activations are all positive and badly scaled.
        if image_dim:
            self.register_buffer("image_mean", torch.zeros(image_dim))
            self.register_buffer("image_std", torch.ones(image_dim))

    @property
    def has_mule(self) -> bool:
        return self.encoder is not None

    def set_image_normalization(self, features: torch.Tensor) -> None:
        with torch.no_grad():
            self.image_mean.copy_(features.mean(0))
            self.image_std.copy_(features.std(0).clamp(min=1e-6))

    def mule_words(self, batch: TextBatch) -> torch.Tensor:
        parts = [self.branches[lang](batch.tokens[start:end], batch.unseen_of(lang)) for lang, start, end in batch.groups]
        return torch.cat(parts, dim=0)

    def encode_text(self, batch: TextBatch, joint: bool = True) -> TextEncoding:
        if not self.has_mule:
            parts = []
            for lang, start, end in batch.groups:
                branch = self.branches[lang]
                words = branch(batch.tokens[start:end], batch.unseen_of(lang))
                parts.append(branch.encoder(words, batch.lengths[start:end]))
            return TextEncoding(None, torch.cat(parts) if joint else None)
        means, words = [], []
        for lang, start, end in batch.groups:
            tokens = batch.tokens[start:end]
            rows, inverse = self.branches[lang].distinct_features(tokens, batch.unseen_of(lang))
            means.append(_mean_of_words(rows, inverse, tokens, batch.lengths[start:end]))
            if joint:
                words.append(gather_rows(rows, inverse, tokens.shape))
        mule = torch.cat(means)
        return TextEncoding(mule, self.encoder(torch.cat(words), batch.lengths) if joint else None)

    def encode_image(self, features: torch.Tensor) -> torch.Tensor:
        if self.image_branch is None:
            raise RuntimeError("this model was built without an image branch (text-only dataset)")
        return F.normalize(self.image_branch((features - self.image_mean) / self.image_std), dim=-1)

    def classify_language(self, mule: torch.Tensor, reverse_scale: float = 1.0) -> torch.Tensor:
        """Language logits of MULE sentence vectors; the gradient reaching MULE is reversed
        (adversarial) and scaled by reverse_scale.

        The classifier reads the L2-normalised vector, the one NC and retrieval compare by
        cosine. On the raw vector, the reversed gradient can raise the classifier's loss
        without bound by growing the vectors' norms, which saturates the LSTM above MULE:
        every sentence then maps to one point (seen at 29,000 images)."""
        return self.classifier(grad_reverse(F.normalize(mule, dim=-1), reverse_scale))

    def word_drift(self, rows: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
        """Every branch's drift; with `rows` (language -> word ids a batch read), of those
        rows alone (train.word_updates=rows: rows no batch reads do not move)."""
        if rows is None:
            return sum(branch.drift() for branch in self.branches.values())
        return sum(self.branches[lang].drift(ids) for lang, ids in rows.items())

    def mule_parameters(self) -> list[nn.Parameter]:
        """What LP trains: every language's embeddings and FC, and the language classifier."""
        if not self.has_mule:
            return []
        return [p for p in (*self.branches.parameters(), *self.classifier.parameters()) if p.requires_grad]


def count_parameters(model: MuleModel) -> dict[str, object]:
    """Parameters, total and per language (the paper's "Parameter Comparison").

    Language-specific counts each language's branch: its embeddings and MULE FC (MULE),
    or its embeddings and whole sentence encoder (PARALLEL-EmbN / EmbN). Shared counts the
    rest: sentence encoder (MULE), image branch and language classifier.
    """

    def n(module: nn.Module) -> int:
        return sum(p.numel() for p in module.parameters())

    per_language = {lang: n(branch) for lang, branch in model.branches.items()}
    total = n(model)
    return {
        "total": total,
        "language_specific": sum(per_language.values()),
        "shared": total - sum(per_language.values()),
        "per_language": per_language,
    }


def word_dims(model: MuleModel) -> dict[str, int]:
    """Each language's word width (its embedding's)."""
    return {lang: branch.embed.embedding_dim for lang, branch in model.branches.items()}


def with_added_language(base: MuleModel, cfg: ModelConfig, lang: str, vocab_size: int,
                        vectors: torch.Tensor | None = None, words: Sequence[str] | None = None,
                        ngrams: tuple[list[str], torch.Tensor] | None = None,
                        word_dim: int | None = None) -> MuleModel:  # fmt: skip
    """`base` plus a language: a new model holding every weight of `base`, frozen, and a
    new branch (word embeddings + FC into MULE) for `lang`, the only trainable part. The
    language classifier gains a row for the new language, zero and frozen (LC stays off
    while a language is added). Base languages keep bit-identical embeddings: nothing they
    pass through can change. `word_dim`: the new branch's word width (default: the base's
    first language's; an aligned start needs only mule_dim)."""
    if not base.has_mule:
        raise ValueError("a language is added through its own MULE branch; this model has none (sharing=parallel)")
    if lang in base.languages:
        raise ValueError(f"the model already reads {lang!r}")
    languages = [*base.languages, lang]
    sizes = {name: branch.embed.num_embeddings for name, branch in base.branches.items()} | {lang: vocab_size}
    dims = word_dims(base)
    dims[lang] = word_dim or dims[base.languages[0]]
    image_dim = base.image_mean.numel() if base.image_branch is not None else None
    known = {name: branch.words for name, branch in base.branches.items()} | {lang: words}
    model = MuleModel(languages, sizes, dims, image_dim, cfg,
                      None if any(w is None for w in known.values()) else known)  # fmt: skip
    state = {k: v for k, v in base.state_dict().items() if not k.startswith("classifier.")}
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected or any(not (k.startswith(f"branches.{lang}.") or k.startswith("classifier.")) for k in missing):
        raise ValueError(f"base model and config disagree: missing {missing}, unexpected {unexpected}")
    with torch.no_grad():
        model.classifier.weight[: len(base.languages)] = base.classifier.weight
        model.classifier.bias[: len(base.languages)] = base.classifier.bias
        model.classifier.weight[len(base.languages) :] = 0.0  # never trained (LC stays off): no random row
        model.classifier.bias[len(base.languages) :] = 0.0
    if vectors is not None:
        model.branches[lang].init_vectors(vectors, ngrams)
    for name, parameter in model.named_parameters():
        parameter.requires_grad = parameter.requires_grad and name.startswith(f"branches.{lang}.")
    return model


def table_names(model: MuleModel, lang: str) -> list[str]:
    """The state-dict names of a language's word and n-gram tables: what output.tables stores."""
    tables = {id(t) for t in model.branches[lang].word_parameters()}
    return [f"branches.{lang}.{name}" for name, p in model.branches[lang].named_parameters() if id(p) in tables]


def round_tables(model: MuleModel, precisions: Mapping[str, str]) -> dict[str, str]:
    """Rounds each named language's word and n-gram tables to its precision (float32,
    float16 or int8: mule_core.table_precision), in place (they stay float32 tensors): what
    a model file stores of them (data_catalog.model_files), so the model measured, served
    and saved is one model. Returns the tables' parameter names and their precisions."""
    names = {}
    parameters = dict(model.named_parameters())
    with torch.no_grad():
        for lang, precision in precisions.items():
            check_precision(precision, f"{lang}'s tables")
            for name in table_names(model, lang):
                parameters[name].copy_(rounded(parameters[name], precision))
                names[name] = precision
    return names


def build_model(cfg: ModelConfig, vocabulary: Vocabulary, image_dim: int | None) -> MuleModel:
    """A new model for the vocabulary's languages, its word embeddings set to their vectors."""
    model = MuleModel(vocabulary.languages, vocabulary.sizes, vocabulary.dim, image_dim, cfg, vocabulary.words)
    for lang, vectors in vocabulary.vectors.items():
        model.branches[lang].init_vectors(vectors, (vocabulary.ngram_vectors or {}).get(lang))
    return model


def create_model(settings: ModelConfig, vocabularies: dict[str, Vocab], image_dim: int | None = 2048,
                 word_dim: int = 300) -> MuleModel:  # fmt: skip
    """An untrained model for these languages, from the model library alone (no catalog,
    no files): `vocabularies` are each language's words (mule_core.vocabulary.Vocab,
    e.g. Vocab.build(tokenised sentences)), word vectors start random, and `image_dim` is
    the image features' size (2048: ResNet-152's; None: a text-only model)."""
    words = {lang: vocab.tokens for lang, vocab in vocabularies.items()}
    return MuleModel(list(vocabularies), {lang: len(v) for lang, v in vocabularies.items()}, word_dim, image_dim,
                     settings, words)  # fmt: skip
