"""Rows laid out by group: the positions that put each group's members in one row of a
padded (groups x largest group) table, members in their order. The losses pad each
anchor's thresholds this way, the metrics each group's candidates."""

from __future__ import annotations

import torch


def group_slots(group: torch.Tensor, n_groups: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(order, slot, width): member order[i] goes to row group[order[i]], column slot[i];
    width is the largest group's size (0 without members). group: values in [0, n_groups)."""
    order = torch.argsort(group, stable=True)
    counts = torch.bincount(group, minlength=n_groups)
    slot = torch.arange(len(group), device=group.device) - (counts.cumsum(0) - counts)[group[order]]
    return order, slot, int(counts.max()) if len(group) else 0
