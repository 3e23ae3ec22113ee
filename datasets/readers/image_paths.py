"""Where an image a table names is: relative to the table's folder or the images folder, or
absolute under one of them, and never outside them."""

from __future__ import annotations

import os
from pathlib import Path


class OutsideDataset(Exception):
    """An image path that leads out of the dataset's folders."""


def locate_image(value: str, bases: list[Path]) -> tuple[str, str] | None:
    """(image id, file) of an image path as the table names it, relative to the table's
    folder or the images folder (the first where it is a file), or absolute under one of
    them; None when it is in neither. A path that leads out of both (`../x.png`, `/etc/x`)
    raises OutsideDataset: a dataset's files stay inside it (its key covers only them, and mule
    serve serves only them). Links inside the folders are followed. Strings, not Paths:
    a table of 100,000 images kept 50 MB of Path objects."""
    named = os.path.normpath(value.replace("\\", "/"))
    if os.path.isabs(named):
        for base in map(str, bases):
            for root in dict.fromkeys((os.path.normpath(base), os.path.realpath(base))):
                if named.startswith(root.rstrip("/") + "/"):
                    relative = os.path.relpath(named, root)
                    file = os.path.join(base, relative)
                    return (relative, file) if os.path.isfile(file) else None
        raise OutsideDataset()
    if named == ".." or named.startswith("../"):
        raise OutsideDataset()
    for base in map(str, bases):
        file = os.path.join(base, named)
        if os.path.isfile(file):  # follows links, to files and through linked folders
            return named, file
    return None
