"""Import mule from this checkout when it is not installed (a GPU machine with torch but
not mule's other dependencies): `mule.<folder>` maps onto the checkout's folders, as the
installed package does (pyproject's package-dir)."""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def use_checkout() -> None:
    if "mule" in sys.modules or importlib.util.find_spec("mule") is not None:
        return
    package = types.ModuleType("mule")
    package.__path__ = [str(ROOT)]  # a namespace over the checkout: mule.mule_core -> ROOT/mule_core
    sys.modules["mule"] = package
