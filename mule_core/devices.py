"""Which device to compute on."""

from __future__ import annotations

import torch


def resolve_device(name: str) -> torch.device:
    """"auto": CUDA when there is a GPU, else the CPU; any other name as torch reads it."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)
