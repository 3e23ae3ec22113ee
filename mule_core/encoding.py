"""Encoding and evaluating a split with a model: every caption's and image's vectors, and
the retrieval metrics over them (what training's validation, the evaluate stage and the
cross-lingual tables read)."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from mule.mule_core.metrics import (
    cross_lingual_recalls,
    per_language_recalls,
    perfect_translation_ceiling,
    translation_pair_recalls,
)
from mule.mule_core.model import MuleModel
from mule.mule_core.split_tensors import SplitTensors

# -- encoding and evaluation ----------------------------------------------------------

@torch.no_grad()
def encode_split(
    model: MuleModel, data: SplitTensors, device: torch.device, batch_size: int = 1024, joint: bool = True
) -> dict[str, torch.Tensor]:
    """Embeddings of every caption (MULE and multimodal) and every image of a split."""
    model.eval().to(device)
    mule_parts, joint_parts, order = [], [], []
    for index, lang in enumerate(data.languages):
        rows = np.nonzero(data.caption_lang == index)[0]
        for start in range(0, len(rows), batch_size):
            chunk = torch.from_numpy(rows[start : start + batch_size])
            encoded = model.encode_text(data.text_batch(chunk, [(lang, 0, len(chunk))]).to(device), joint=joint)
            if encoded.mule is not None:  # models without a MULE layer have none
                mule_parts.append(encoded.mule)
            if joint:
                joint_parts.append(encoded.joint)
            order.append(chunk)
    inverse = torch.argsort(torch.cat(order)).to(device)  # back to caption-row order
    out = {"caption_mule": torch.cat(mule_parts)[inverse]} if mule_parts else {}
    if joint:
        out["caption_joint"] = torch.cat(joint_parts)[inverse]
    if joint and data.features is not None and model.image_branch is not None:
        feats = data.features
        out["image"] = torch.cat(
            [model.encode_image(feats[s : s + batch_size].to(device)) for s in range(0, len(feats), batch_size)]
        )
    return out


def evaluate_split(model: MuleModel, data: SplitTensors, device: torch.device, ks=(1, 5, 10),
                   encoded: dict[str, torch.Tensor] | None = None) -> dict:  # fmt: skip
    """Per-language recall table (see metrics.per_language_recalls). `encoded`: the split's
    encode_split, when the caller has it (the evaluate stage encodes a split once)."""
    encoded = encoded if encoded is not None else encode_split(model, data, device)
    return per_language_recalls(
        encoded["image"],
        encoded["caption_joint"],
        torch.from_numpy(data.caption_image).to(device),
        torch.from_numpy(data.caption_lang).to(device),
        data.languages,
        ks,
    )


def sentence_vectors(model: MuleModel, data: SplitTensors, device: torch.device, layer: str,
                     encoded: dict[str, torch.Tensor] | None = None) -> torch.Tensor:  # fmt: skip
    """Every caption's L2-normalised vector at the MULE ("mule") or multimodal ("joint") layer."""
    if encoded is None:
        encoded = encode_split(model, data, device, joint=layer == "joint")
    return encoded["caption_joint"] if layer == "joint" else F.normalize(encoded["caption_mule"], dim=-1)


def cross_lingual(model: MuleModel, data: SplitTensors, device: torch.device, layer: str,
                  encoded: dict[str, torch.Tensor] | None = None) -> dict:  # fmt: skip
    """Cross-lingual sentence retrieval at the MULE ("mule") or multimodal ("joint") layer,
    image level (metrics.cross_lingual_recalls)."""
    emb = sentence_vectors(model, data, device, layer, encoded)
    return cross_lingual_recalls(emb, torch.from_numpy(data.caption_image).to(device),
                                 torch.from_numpy(data.caption_lang).to(device), data.languages)  # fmt: skip


def translation_pairs(model: MuleModel, data: SplitTensors, device: torch.device, layer: str,
                      encoded: dict[str, torch.Tensor] | None = None) -> dict:  # fmt: skip
    """Cross-lingual retrieval of each caption's own translation among the target language's
    translated lines (metrics.translation_pair_recalls); {} when the split has none."""
    if data.caption_group is None or not (data.caption_group >= 0).any():
        return {}
    emb = sentence_vectors(model, data, device, layer, encoded)
    return translation_pair_recalls(emb, torch.from_numpy(data.caption_group).to(device),
                                    torch.from_numpy(data.caption_lang).to(device), data.languages)  # fmt: skip


def translation_ceilings(model: MuleModel, data: SplitTensors, device: torch.device, layer: str,
                         encoded: dict[str, torch.Tensor] | None = None) -> dict:  # fmt: skip
    """Per language with translated lines and other captions too (Multi30K's en and de):
    its captions against its own translated lines, "en->en" (metrics.perfect_translation_ceiling).
    What image-level en->x can reach for a language x that has only the translated lines
    (fr, cs); {} when the split has no translated lines."""
    if data.caption_group is None or not (data.caption_group >= 0).any():
        return {}
    emb = sentence_vectors(model, data, device, layer, encoded)
    image, lang = torch.from_numpy(data.caption_image).to(device), torch.from_numpy(data.caption_lang).to(device)
    group = torch.from_numpy(data.caption_group).to(device)
    out = {}
    for index, name in enumerate(data.languages):
        mine = lang == index
        if (mine & (group >= 0)).any() and (mine & (group < 0)).any():
            row = perfect_translation_ceiling(emb, image, group, lang, index)
            if row:
                out[f"{name}->{name}"] = row
    return out
