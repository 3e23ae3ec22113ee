"""Options by dotted name: strings (the CLI's `--set train.epochs=3`) or JSON values (a
flow's parameters) converted to the field's type, an unknown name an error that lists the
valid ones, and a config as a dict and back (what a model file stores)."""

from __future__ import annotations

import dataclasses
import logging
import typing
from typing import Any

from mule.config.sections import SECTIONS, IndexConfig, MuleConfig
from mule.config.validation import validate, validate_index
from mule.mule_core import settings as model_settings
from mule.mule_core.settings import ConfigError


def _field_types(section_cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(section_cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(section_cls)}


def _coerce(value: Any, annotation: Any, key: str) -> Any:
    """Converts a CLI string (or a JSON value from a flow parameter) to the field's type."""
    origin = typing.get_origin(annotation)
    try:
        if annotation is bool:
            if isinstance(value, bool):
                return value
            text = str(value).strip().lower()
            if text in ("1", "true", "yes", "on"):
                return True
            if text in ("0", "false", "no", "off"):
                return False
            raise ValueError(f"expected true or false, got {value!r}")
        if annotation is int:
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError(f"expected an integer, got {value!r}")
            return int(value)
        if annotation is float:
            return float(value)
        if annotation is str:
            return str(value)
        if origin is tuple:
            (item_type, _) = typing.get_args(annotation)
            items = value if isinstance(value, (list, tuple)) else [v for v in str(value).split(",") if v.strip()]
            return tuple(_coerce(v.strip() if isinstance(v, str) else v, item_type, key) for v in items)
        if origin is dict:
            _, value_type = typing.get_args(annotation)
            if isinstance(value, dict):
                pairs = value.items()
            else:
                pairs = []
                for part in (p for p in str(value).split(",") if p.strip()):
                    if "=" not in part:
                        raise ValueError(f"expected lang=value pairs separated by commas, got {part!r}")
                    k, v = part.split("=", 1)
                    pairs.append((k.strip(), v.strip()))
            return {str(k): _coerce(v, value_type, key) for k, v in pairs}
    except (TypeError, ValueError) as error:
        raise ConfigError(f"config option {key}: {error}") from None
    raise ConfigError(f"config option {key}: unsupported type {annotation}")  # pragma: no cover


def option_names() -> list[str]:
    return [f"{s}.{name}" for s in SECTIONS for name in _field_types(type(getattr(MuleConfig(), s)))]


def index_section(overrides: dict[str, Any]) -> IndexConfig:
    """The index section's defaults with these of its options ('index.breadth': '256'),
    converted and checked as in a whole config, without resolving one (`mule serve`)."""
    index, types_ = IndexConfig(), _field_types(IndexConfig)
    for key, value in overrides.items():
        section, _, name = key.partition(".")
        if section != "index" or name not in types_:
            raise ConfigError(f"unknown index option {key!r}; index options are: "
                              f"{', '.join('index.' + n for n in types_)}")  # fmt: skip
        setattr(index, name, _coerce(value, types_[name], key))
    validate_index(index)
    return index


def apply_overrides(cfg: MuleConfig, overrides: dict[str, Any] | None, say_renamed: bool = True) -> MuleConfig:
    """`cfg` with `overrides` ({"train.epochs": 3, ...}) applied and checked; an old option
    name is read as its new one (said once a process, unless `say_renamed` is False)."""
    cfg = dataclasses.replace(cfg, **{s: dataclasses.replace(getattr(cfg, s)) for s in SECTIONS})
    for key, value in renamed(overrides or {}, say_renamed).items():
        section, _, name = key.partition(".")
        if section not in SECTIONS or not name:
            raise ConfigError(f"unknown config option {key!r}; options are: {', '.join(option_names())}")
        section_obj = getattr(cfg, section)
        types_ = _field_types(type(section_obj))
        if name not in types_:
            raise ConfigError(f"unknown config option {key!r}; options are: {', '.join(option_names())}")
        setattr(section_obj, name, _coerce(value, types_[name], key))
    validate(cfg)
    return cfg


def parse_assignments(assignments: list[str]) -> dict[str, str]:
    """['train.epochs=3', ...] from the CLI -> {'train.epochs': '3'}."""
    out = {}
    for item in assignments:
        if "=" not in item:
            raise ConfigError(f"--set expects KEY=VALUE, got {item!r}")
        key, value = item.split("=", 1)
        out[key.strip()] = value
    return out


def to_dict(cfg: MuleConfig) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


# Options that existed once. Model files keep the config they were trained with, so these
# are dropped when such a file is read: they only steered training, never how a model is used.
RETIRED_OPTIONS = {
    "loss.warmup_epochs",  # now loss.mining_warmup_steps (schedules count steps: one config for every size)
    "train.reuse",  # a model is reused when the train stage's key is unchanged (pipeline.decisions), never by a flag
}


# Options renamed: the old name is read as the new one, said once a process (a preset, a
# saved deployment or a stored config written with it still runs)
RENAMED_OPTIONS = {"train.model_name": "output.model_name",
                   "train.add_language": "add.languages", "train.base_model": "add.base_model",
                   "train.add_captions": "add.captions", "train.add_start": "add.start", "train.add_words": "add.words",
                   "text.vectors": "vectors.files", "text.init": "vectors.init",
                   **{f"text.fasttext_{name}": f"vectors.fasttext_{name}"
                      for name in ("model", "epochs", "min_count", "buckets", "threads")}}  # fmt: skip
# renamed options whose values changed shape too: the old value read as the new option's
RENAMED_VALUES = {"output.half_tables": ("output.tables", lambda v: "float16" if str(v).lower() in ("true", "1")
                                         else "float32")}  # fmt: skip
_said_renamed: set[str] = set()


def renamed(overrides: dict[str, Any], say: bool = True) -> dict[str, Any]:
    """The overrides with renamed options under their new names (the new name wins where
    both are given), each old name said once (`say`: a stored config is read in silence)."""
    out = {}
    for key, value in overrides.items():
        new = RENAMED_OPTIONS.get(key)
        if key in RENAMED_VALUES:
            new, convert = RENAMED_VALUES[key]
            value = convert(value)
        if new is None:
            out[key] = value
            continue
        if say and key not in _said_renamed:
            _said_renamed.add(key)
            logging.getLogger("mule.config").warning("%s is now %s: read as it (write %s=...)", key, new, new)
        out.setdefault(new, value)
    return out


# Options added later whose default changed what a model is: a stored config without them
# was trained as this value says, whatever today's default (mule_core.settings.INTRODUCED).
INTRODUCED_OPTIONS = {f"{section}.{name}": value for section, options in model_settings.INTRODUCED.items()
                      for name, value in options.items()}  # fmt: skip


def from_dict(data: dict[str, Any]) -> MuleConfig:
    """Inverse of to_dict (for configs stored next to models)."""
    preset = data.get("preset", "default")  # a label: the sections hold every value
    overrides = {f"{s}.{k}": v for s in SECTIONS for k, v in data.get(s, {}).items()}
    overrides = {**INTRODUCED_OPTIONS, **overrides}
    overrides = {k: v for k, v in overrides.items() if k not in RETIRED_OPTIONS}
    return apply_overrides(MuleConfig(preset=preset), overrides, say_renamed=False)
