"""The one retry of a failed batch, photo by photo, that the command line and Ray share."""

import pytest

from sapiens2.batch.retry import each_alone_on_failure
from sapiens2.errors import CheckpointError


def test_a_batch_that_runs_gives_its_outcomes_in_one_call():
    calls = []
    outcomes = each_alone_on_failure(lambda items: calls.append(items) or [x * 2 for x in items], [1, 2, 3])
    assert outcomes == [2, 4, 6] and calls == [[1, 2, 3]]


def test_a_failed_batch_is_tried_item_by_item_and_the_bad_one_keeps_its_error():
    calls = []

    def run(items):
        calls.append(items)
        if "bad" in items:
            raise ValueError("cannot read it")
        return [item.upper() for item in items]

    outcomes = each_alone_on_failure(run, ["a", "bad", "c"])
    assert outcomes[0] == "A" and outcomes[2] == "C"
    assert isinstance(outcomes[1], ValueError) and str(outcomes[1]) == "cannot read it"
    assert calls == [["a", "bad", "c"], ["a"], ["bad"], ["c"]]
    assert each_alone_on_failure(run, []) == []


def test_a_failure_of_the_task_itself_is_raised_at_once():
    calls = []

    def run(items):
        calls.append(items)
        raise CheckpointError("no such checkpoint")

    with pytest.raises(CheckpointError):
        each_alone_on_failure(run, [1, 2])
    assert calls == [[1, 2]]
