"""A trained model as two ONNX graphs, one per tower, for apps that run ONNX Runtime (or
any ONNX engine) instead of mule's PyTorch code:

    text tower   words (n, T) int64    rows of every language's word table, stacked
                 grams (n, T, G) int64 rows of every language's n-gram table, stacked (0: none)
                 lengths (n,) int64    each sentence's words (the rest of a row pads)
                 lang (n,) int64       each sentence's language (its index in `languages`)
                 -> vectors (n, D) float32, unit rows
    image tower  crops (n, k, 3, S, S) uint8 (the model's crop transform's output)
                 -> vectors (n, D) float32, unit rows

The text tower holds the word and n-gram tables, each language's FC into MULE and the
shared sentence encoder (an LSTM over a sentence's first `lengths` words, its last hidden
state, an FC); the image tower the extractor (normalisation inside), the mean over crops,
the features' standardisation and the image branch. Tokenising stays in Python: a
sentence becomes words with the model's tokenisers (janome, jieba, UAX #29) and its words
become rows as everywhere in mule (`text_inputs`, from Vocabulary.encode's ids).

Each language's rows sit at an offset in the stacked tables (`layout`): row 0 of each
stacked table is zero, so a word outside the vocabulary (its vector is the mean of its
n-grams' alone) has word row 0, and padding is 0 everywhere. A word's vector is its own
row plus the mean of its n-grams' rows, as in mule_core.subwords.

int8 variants: the text tower's tables, FC and LSTM in 8 bits with activations quantised
per call (`quantize`); the image tower's weights in 8 bits, computed in float32
(`quantize_weights`: why, there). What they cost in recall is measured, not assumed
(bench/onnx_towers.py).

    towers = export_towers(model, network, input_size=224, crops=1)   # {"textual/model.onnx": bytes, ...}
"""

from __future__ import annotations

import io
import logging
import warnings
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from mule.mule_core.model import MuleModel
from mule.mule_core.vocabulary import EncodedSentences, Vocabulary

TEXT_INPUTS = ("words", "grams", "lengths", "lang")
OPSET = 17


@dataclass(frozen=True)
class TextLayout:
    """Where each language's rows start in the stacked tables (row 0 of both is zero)."""

    languages: list[str]
    word_offsets: dict[str, int]  # lang -> the stacked row of its word 0
    gram_offsets: dict[str, int]  # lang -> the stacked row of its n-gram 0 (n-gram ids count from 1)

    def as_dict(self) -> dict:
        return {"languages": self.languages, "word_offsets": self.word_offsets, "gram_offsets": self.gram_offsets}


def layout(model: MuleModel) -> TextLayout:
    words, grams, w, g = {}, {}, 1, 0
    for lang in model.languages:
        branch = model.branches[lang]
        words[lang], w = w, w + branch.embed.num_embeddings
        grams[lang] = g
        if branch.subwords is not None:
            g += branch.subwords.vectors.num_embeddings - 1  # n-gram ids count from 1
    return TextLayout(list(model.languages), words, grams)


class TextTower(nn.Module):
    """The text side of a MULE model as one graph over every language (see the module's doc)."""

    def __init__(self, model: MuleModel):
        super().__init__()
        if not model.has_mule:
            raise ValueError("the ONNX text tower is a MULE model's (one shared sentence encoder); "
                             "this one has a sentence encoder per language (model.sharing=parallel)")  # fmt: skip
        branches = [model.branches[lang] for lang in model.languages]
        # A narrower branch (an added language's) is padded with zeros to the widest: its
        # vectors' extra coordinates are 0 and its FC's extra columns 0, the same numbers.
        dim = max(b.embed.embedding_dim for b in branches)
        zero = torch.zeros(1, dim)
        self.words = nn.Parameter(torch.cat([zero, *(_wide(b.embed.weight.detach(), dim) for b in branches)]),
                                  requires_grad=False)  # fmt: skip
        grams = [_wide(b.subwords.vectors.weight.detach()[1:], dim) for b in branches if b.subwords is not None]
        self.grams = nn.Parameter(torch.cat([zero, *grams]), requires_grad=False)
        # every language's FC as one: (L * M) outputs, the sentence's language picked after
        self.fc = nn.Linear(dim, len(branches) * branches[0].fc.out_features)
        with torch.no_grad():
            self.fc.weight.copy_(torch.cat([_wide(b.fc.weight, dim) for b in branches]))
            self.fc.bias.copy_(torch.cat([b.fc.bias for b in branches]))
        self.languages, self.mule_dim = len(branches), branches[0].fc.out_features
        self.encoder = model.encoder

    def forward(self, words: torch.Tensor, grams: torch.Tensor, lengths: torch.Tensor, lang: torch.Tensor) -> torch.Tensor:
        count = (grams > 0).sum(-1, keepdim=True).clamp(min=1).to(self.words.dtype)
        vectors = F.embedding(words, self.words) + F.embedding(grams, self.grams).sum(2) / count
        every = self.fc(vectors).unflatten(-1, (self.languages, self.mule_dim))  # (n, T, L, M)
        pick = F.one_hot(lang, self.languages).to(every.dtype)[:, None, :, None]  # x1 and x0: exact
        # A one-way LSTM's output at a sentence's last word is its hidden state there, whatever
        # pads follow: no packing (which torch's ONNX exporter cannot take), the same numbers.
        steps, _ = self.encoder.lstm((every * pick).sum(2))
        last = steps.gather(1, (lengths - 1).clamp(min=0)[:, None, None].expand(-1, 1, steps.shape[2]))[:, 0]
        return F.normalize(self.encoder.fc(last), dim=-1)


def _wide(rows: torch.Tensor, dim: int) -> torch.Tensor:
    """Rows padded with zero columns to `dim` (float32: a table stored in half is computed in full)."""
    rows = rows.float()
    return rows if rows.shape[1] == dim else F.pad(rows, (0, dim - rows.shape[1]))


class ImageTower(nn.Module):
    """Crops (n, k, 3, S, S) uint8 -> unit vectors: extractor, mean over crops, image branch."""

    def __init__(self, network: nn.Module, model: MuleModel):
        super().__init__()
        if model.image_branch is None:
            raise ValueError("this model was trained without images: it has no image tower")
        self.network, self.model = network, model

    def forward(self, crops: torch.Tensor) -> torch.Tensor:
        b, k = crops.shape[:2]
        features = self.network(crops.flatten(0, 1)).view(b, k, -1).float().mean(1)
        return self.model.encode_image(features)


def export_towers(model: MuleModel, network: nn.Module | None, input_size: int, crops: int) -> dict[str, bytes]:
    """Both towers, float32 and int8, by the file names an exported folder gives them
    (immich's: textual/, visual/); no image tower without images or an extractor."""
    text = export_text(model)
    towers = {"textual/model.onnx": text, "textual/model.int8.onnx": quantize(text)}
    if model.image_branch is not None and network is not None:
        image = export_image(network, model, input_size, crops)
        towers |= {"visual/model.onnx": image, "visual/model.int8.onnx": quantize_weights(image)}
    return towers


def export_text(model: MuleModel) -> bytes:
    """The text tower as ONNX bytes."""
    tower = TextTower(model).eval()
    example = (torch.tensor([[2, 3]]), torch.zeros(1, 2, 1, dtype=torch.long), torch.tensor([2]), torch.tensor([0]))
    return _export(tower, example, TEXT_INPUTS,
                   {"words": {0: "n", 1: "T"}, "grams": {0: "n", 1: "T", 2: "G"}, "lengths": {0: "n"},
                    "lang": {0: "n"}, "vectors": {0: "n"}})  # fmt: skip


def export_image(network: nn.Module, model: MuleModel, input_size: int, crops: int) -> bytes:
    """The image tower as ONNX bytes, for the model's crop size and number of crops."""
    tower = ImageTower(network.cpu().eval().to(memory_format=torch.contiguous_format), model).eval()
    example = (torch.zeros(1, crops, 3, input_size, input_size, dtype=torch.uint8),)
    return _export(tower, example, ("crops",), {"crops": {0: "n"}, "vectors": {0: "n"}})


def _export(module: nn.Module, example: tuple, inputs: tuple, axes: dict) -> bytes:
    buffer = io.BytesIO()
    with torch.no_grad(), warnings.catch_warnings():
        # torch warns that an LSTM exported with a batch of more than one may break on
        # another batch size: the example is one sentence, and the tests run batches of many
        warnings.filterwarnings("ignore", message=".*LSTM.*", category=UserWarning)
        warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)  # shape checks traced as constants
        torch.onnx.export(module, example, buffer, input_names=list(inputs), output_names=["vectors"],
                          dynamic_axes=axes, opset_version=OPSET, dynamo=False)  # fmt: skip
    return buffer.getvalue()


def quantize(model: bytes) -> bytes:
    """The text tower with 8-bit tables and weights, activations quantised per call
    (ONNX Runtime's dynamic quantisation: the tables' Gather, the FC's MatMul, the LSTM)."""
    import tempfile
    from pathlib import Path

    from onnxruntime.quantization import QuantType, quantize_dynamic

    with tempfile.TemporaryDirectory() as tmp, _quiet_root_logger():
        source, target = Path(tmp) / "float32.onnx", Path(tmp) / "int8.onnx"
        source.write_bytes(model)
        quantize_dynamic(source, target, weight_type=QuantType.QInt8)
        return target.read_bytes()


@contextmanager
def _quiet_root_logger():
    """ONNX Runtime's quantiser logs through the root logger (`logging.warning`: advice to
    pre-process the graph, which changes nothing for these towers), and that call would
    also give the root logger a handler of its own for good: neither reaches the console."""
    root = logging.getLogger()
    quiet = logging.NullHandler()
    added = not root.handlers
    if added:
        root.addHandler(quiet)
    drop = logging.Filter("onnxruntime")  # passes only records of onnxruntime's own loggers: root's are dropped
    root.addFilter(drop)
    try:
        yield
    finally:
        root.removeFilter(drop)
        if added:
            root.removeHandler(quiet)


def quantize_weights(model: bytes, ops: tuple[str, ...] = ("Conv", "Gemm", "MatMul")) -> bytes:
    """The graph with its convolution and FC weights stored in 8 bits (symmetric, one scale
    per output channel) and computed in float32: a file a quarter the size. For the image
    tower, because quantising its activations too costs far more: EfficientNet-Lite0's
    depthwise convolutions in 8 bits turned a real photo's vector to cosine 0.88 (dynamic)
    or 0.93 (static, calibrated on 64 photos) of float32's on average, and the image
    branch's standardisation amplifies that error wherever a feature barely varied in
    training (bench/onnx_towers.py measures what ships)."""
    import onnx
    from onnx import helper, numpy_helper

    graph_model = onnx.load_from_string(model)
    graph = graph_model.graph
    initializers = {i.name: i for i in graph.initializer}
    dequantize = {}
    for node in graph.node:
        name = node.input[1] if node.op_type in ops and len(node.input) > 1 else None
        if name not in initializers or name in dequantize:
            continue
        weight = numpy_helper.to_array(initializers[name]).astype(np.float32)
        # Conv and Gemm (transB) keep output channels on axis 0; MatMul's weight on its last
        axis = weight.ndim - 1 if node.op_type == "MatMul" else 0
        others = tuple(i for i in range(weight.ndim) if i != axis)
        scale = np.abs(weight).max(axis=others) / 127.0
        scale = np.where(scale > 0, scale, 1.0).astype(np.float32)
        shape = [-1 if i == axis else 1 for i in range(weight.ndim)]
        stored = np.clip(np.round(weight / scale.reshape(shape)), -127, 127).astype(np.int8)
        graph.initializer.remove(initializers[name])
        graph.initializer.extend([numpy_helper.from_array(stored, f"{name}.int8"),
                                  numpy_helper.from_array(scale, f"{name}.scale"),
                                  numpy_helper.from_array(np.zeros(scale.shape, np.int8), f"{name}.zero")])  # fmt: skip
        dequantize[name] = helper.make_node("DequantizeLinear", [f"{name}.int8", f"{name}.scale", f"{name}.zero"],
                                            [name], axis=axis)  # fmt: skip
    for node in reversed(list(dequantize.values())):
        graph.node.insert(0, node)
    return graph_model.SerializeToString()


def text_tower_info(model: MuleModel, vocabulary: Vocabulary, max_tokens: int, tokenizers: dict) -> dict:
    """What an app needs to feed the text tower (textual/tower.json), and each language's
    n-grams in id order (textual/ngrams/<lang>.txt)."""
    tables = layout(model)
    lengths = vocabulary.ngram_lengths
    return tables.as_dict() | {
        "inputs": {"words": "(n, T) int64: a word's row = word_offsets[lang] + its line in vocab/<lang>.txt (0-based); "
                            "0 for a word outside the vocabulary, and for padding",
                   "grams": "(n, T, G) int64: gram_offsets[lang] + the word's n-gram ids (1-based lines of "
                            "textual/ngrams/<lang>.txt); 0 pads",
                   "lengths": "(n,) int64: words per sentence, at most max_tokens", "lang": "(n,) int64: index in languages"},
        "max_tokens": max_tokens, "ngram_lengths": list(lengths), "tokenizers": tokenizers,
        "ngram_rule": "fastText's n-grams of '<' + word + '>' of these lengths (the wrapped word itself excluded), "
                      "kept where two or more vocabulary words share them; a vocabulary word's own n-grams, another "
                      "word's when it has any (else it is <unk>, row 1)",
        "ngrams": {lang: vocabulary.vocabs[lang].ngrams(lengths).ngrams for lang in model.languages} if lengths else {},
    }  # fmt: skip


def text_inputs(tables: TextLayout, lang: str, encoded: EncodedSentences, index: torch.Tensor | None,
                max_tokens: int) -> dict[str, np.ndarray]:  # fmt: skip
    """The text tower's inputs for sentences of one language: `encoded` are their ids
    (Vocabulary.encode's), `index` the language's n-gram table (NgramTable.index; None
    without n-grams). Words past `max_tokens` are dropped, as in training."""
    word_offset, gram_offset = tables.word_offsets[lang], tables.gram_offsets[lang]
    rows = [ids[:max_tokens] or [1] for ids in encoded.ids]
    ids = np.full((len(rows), max(map(len, rows))), -1, np.int64)  # -1: padding
    for i, row in enumerate(rows):
        ids[i, : len(row)] = row
    padded = ids < 0
    if index is None:  # no n-grams: every word is a vocabulary row (or <unk>)
        words = np.where(padded, 0, word_offset + ids)
        grams = np.zeros((*ids.shape, 1), np.int64)
    else:
        # each word's n-gram ids: its vocabulary row, or (ids from the vocabulary's size on) its unseen row;
        # a row's ids come first and zeros pad it, so adding the offset where an id is keeps the padding zero
        size, vocabulary_rows = index.shape[0], index.numpy()
        unseen = encoded.unseen.numpy() if encoded.unseen is not None else np.zeros((0, 1), np.int32)
        found = np.zeros((*ids.shape, max(vocabulary_rows.shape[1], unseen.shape[1])), np.int64)
        known, outside = ~padded & (ids < size), ids >= size
        found[known, : vocabulary_rows.shape[1]] = vocabulary_rows[ids[known]]
        found[outside, : unseen.shape[1]] = unseen[ids[outside] - size]
        grams = np.where(found > 0, found + gram_offset, 0)
        words = np.where(padded | (ids >= size), 0, word_offset + ids)  # outside the vocabulary: its n-grams alone
    lengths = np.array([len(row) for row in rows], np.int64)
    return {"words": words, "grams": grams, "lengths": lengths,
            "lang": np.full(len(rows), tables.languages.index(lang), np.int64)}  # fmt: skip


class OnnxSession:
    """One tower under ONNX Runtime on the CPU: a dict of arrays in, unit vectors out."""

    def __init__(self, model: bytes | str, threads: int = 0):
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")  # no busy cores between calls
        self.session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])

    def __call__(self, inputs: dict[str, np.ndarray]) -> np.ndarray:
        return self.session.run(None, inputs)[0]
