"""Bilingual word lexicons in the MUSE format ("source target" per line, e.g. en-de.txt)."""

from __future__ import annotations

from pathlib import Path

from mule.mule_core.errors import UserError


class LexiconError(UserError, ValueError):
    pass


def read_muse(path: Path) -> list[tuple[str, str]]:
    pairs = []
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        parts = line.split()
        if len(parts) != 2:
            raise LexiconError(f"{path}:{number}: expected 'source target', got {line!r}")
        pairs.append((parts[0], parts[1]))
    return pairs


def english_lexicons(folder: Path, languages: list[str]) -> dict[str, list[tuple[str, str]]]:
    """lang -> (lang word, English word) pairs, from en-<lang>.txt files; languages without a file are left out."""
    out = {}
    for lang in languages:
        path = Path(folder) / f"en-{lang}.txt"
        if lang != "en" and path.exists():
            out[lang] = [(target, source) for source, target in read_muse(path)]
    return out
