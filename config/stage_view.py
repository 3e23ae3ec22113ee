"""A config as one stage's computation sees it: the sections its declaration names, and
in place of every other an object that fails loudly when read."""

from __future__ import annotations

import dataclasses

from mule.config.sections import SECTIONS, MuleConfig


class UndeclaredSectionError(RuntimeError):
    """A stage's computation read a config section its declaration does not name: a bug,
    since the option would not be part of the stage's key."""


class Undeclared:
    """Stands in a stage's config for each section the stage does not declare."""

    def __init__(self, stage: str, section: str):
        object.__setattr__(self, "_where", (stage, section))

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        stage, section = object.__getattribute__(self, "_where")
        raise UndeclaredSectionError(
            f"stage {stage} read {section}.{name}, and its declaration (pipeline/declaration.py) names no "
            f"{section} option: declare what it reads, so that the stage's key holds it"
        )

    def __deepcopy__(self, memo):
        return self

    def __repr__(self) -> str:
        stage, section = object.__getattribute__(self, "_where")
        return f"<{section}: not declared by stage {stage}>"


def declared_sections(cfg: MuleConfig, stage: str, sections: frozenset[str]) -> MuleConfig:
    """`cfg` as a stage's computation gets it: the sections it declares, and in place of
    every other an object that fails loudly when read."""
    return dataclasses.replace(cfg, **{name: Undeclared(stage, name) for name in SECTIONS if name not in sections})
