"""pytest plugin for bench/fast_tier.py: at the end of each worker, the mule modules it
imported, one JSON line appended to $FAST_TIER_MODULES."""

from __future__ import annotations

import json
import os
import sys


def pytest_sessionfinish(session, exitstatus):
    path = os.environ.get("FAST_TIER_MODULES")
    if path:
        names = sorted(n for n in sys.modules if n == "mule" or n.startswith("mule."))
        with open(path, "a") as out:
            out.write(json.dumps(names) + "\n")
