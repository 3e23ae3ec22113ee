"""How a model's word and n-gram tables are stored: float32, float16 (half the bytes) or
int8 with one float32 scale per row (a quarter). The tables are nearly all of a trained
model's weights (85.3 M of 85.8 M on the Multi30K text), touched a few rows at a time.

    rounded(table, "int8")            # float32, exactly what the stored table loads as
    stored = stored_tables(state, {"branches.en.embed.weight": "int8"})
    state = loaded_tables(stored)     # float32 again, bit for bit `rounded`

int8 rows are symmetric: a row's scale is its largest |value| / 127, each value rounded to
the nearest step (at most half a step off: 1/254 of the row's largest value). A stored int8
table `name` is an int8 tensor beside a float32 tensor `name` + SCALE_SUFFIX of one scale a
row, so a reader without mule gets it back as `q * scale[:, None]`.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from mule.mule_core.settings import TABLE_PRECISIONS as PRECISIONS

SCALE_SUFFIX = "_scale"  # "branches.en.embed.weight_scale": the int8 table's row scales


def check_precision(value: str, option: str) -> str:
    if value not in PRECISIONS:
        raise ValueError(f"{option} must be one of {', '.join(PRECISIONS)}, got {value!r}")
    return value


def int8_rows(table: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 values, float32 scale per row) of a 2-d float table. A row of zeros has scale
    1 (its values 0), so no row divides by zero. Storing a table that loaded from int8
    gives back its very bytes (a model with a language added stores its base's tables
    again): a scale fl(x / 127) is one that its row's largest value again, fl(127 x scale),
    gives back (tests/test_table_precision.py)."""
    table = table.detach().float()
    scale = table.abs().amax(dim=1) / 127.0
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    values = torch.round(table / scale[:, None]).clamp_(-127, 127).to(torch.int8)
    return values, scale


def from_int8_rows(values: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return values.float() * scale.float()[:, None]


def rounded(table: torch.Tensor, precision: str) -> torch.Tensor:
    """The float32 table a file storing `table` at `precision` loads as."""
    if precision == "float16":
        return table.detach().half().float()
    if precision == "int8":
        return from_int8_rows(*int8_rows(table))
    return table.detach().float()


def stored_tables(state: Mapping[str, torch.Tensor], precisions: Mapping[str, str]) -> dict[str, torch.Tensor]:
    """`state` with the tensors `precisions` names stored at theirs (an int8 one with its scales)."""
    out = dict(state)
    for name, precision in precisions.items():
        if name not in out or precision == "float32":
            continue
        if precision == "float16":
            out[name] = out[name].half()
        elif precision == "int8":
            out[name], out[name + SCALE_SUFFIX] = int8_rows(out[name])
        else:
            check_precision(precision, name)
    return out


def loaded_tables(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A stored state back in float32: int8 tables times their scales (the scales dropped),
    float16 ones widened; the rest as it is."""
    out = {}
    for name, tensor in state.items():
        if name.endswith(SCALE_SUFFIX) and name[: -len(SCALE_SUFFIX)] in state:
            continue
        if tensor.dtype == torch.int8 and name + SCALE_SUFFIX in state:
            out[name] = from_int8_rows(tensor, state[name + SCALE_SUFFIX])
        elif tensor.dtype == torch.float16:
            out[name] = tensor.float()
        else:
            out[name] = tensor
    return out
