"""Hooks (pipeline.hooks): each is a Hook, its methods are the points the runner calls, and
a method named otherwise is refused when the runner is built, not left never called."""

import pytest

from mule.flows.stages import hooks as flow_hooks
from mule.pipeline.hooks import POINTS, Hook, check_hooks
from mule.pipeline.runner import Runner, untracked
from mule.storage.workdir import Workdir


def test_the_points_are_kedros_and_mules_own():
    assert POINTS == {"before_pipeline_run", "after_pipeline_run", "before_stage_run", "around_compute",
                      "after_stage_run", "on_stage_error", "on_stage_reused"}  # fmt: skip


def test_every_hook_mule_runs_with_is_one():
    for hook in [*flow_hooks(), *untracked()]:
        assert isinstance(hook, Hook)
        assert check_hooks([hook]) == [hook]


def test_a_misspelt_point_is_refused_by_name(tmp_path):
    class Late(Hook):
        def after_stage_runs(self, run) -> None:  # one letter too many: never called
            raise AssertionError

    with pytest.raises(TypeError, match=r"Late has after_stage_runs, which is no hook point; the points are "):
        Runner(Workdir.at(tmp_path), [Late()])


def test_an_object_that_is_no_hook_is_refused(tmp_path):
    class Loose:
        def after_stage_run(self, run) -> None: ...

    with pytest.raises(TypeError, match="Loose is not a mule.pipeline.hooks.Hook"):
        Runner(Workdir.at(tmp_path), [Loose()])


def test_a_hook_that_overrides_nothing_changes_nothing():
    compute = object()
    assert Hook().around_compute(None, compute) is compute
