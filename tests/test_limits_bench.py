"""bench/limits.py's arithmetic, checked by hand: where a rebuild's time outside its stages went."""

import importlib.util

from mule.storage.code_digests import REPO


def limits():
    spec = importlib.util.spec_from_file_location("limits", REPO / "bench" / "limits.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_time_outside_the_stages_is_split_into_before_between_and_after():
    # the command ran 100.0-130.0; ingest 104-110, features 111-120, train 122.5-129 (records
    # hold when each finished and its seconds, in any order)
    found = {"train": {"finished": 129.0, "seconds": 6.5}, "ingest": {"finished": 110.0, "seconds": 6.0},
             "features": {"finished": 120.0, "seconds": 9.0}, "index": {"status": "reused"}}  # fmt: skip
    assert limits().outside_the_stages(found, 100.0, 130.0) == {"before": 4.0, "between": 3.5, "after": 1.0}
    assert limits().outside_the_stages({}, 100.0, 130.0) == {}
