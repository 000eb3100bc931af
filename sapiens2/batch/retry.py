"""The one place where a failed batch is tried again photo by photo: the command line's and Ray's."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from sapiens2.batch.report import TASK_ERRORS

Item = TypeVar("Item")
Outcome = TypeVar("Outcome")


def each_alone_on_failure(
    run: Callable[[list[Item]], Sequence[Outcome]], items: Sequence[Item]
) -> list[Outcome | Exception]:
    """`run(items)`: one outcome per item, in order. When the batch fails, each item is run alone, and one
    that fails alone has its error for outcome. A failure of the task itself (TASK_ERRORS: its checkpoint,
    its detector) is raised: no photo would do better alone."""
    if not items:
        return []
    try:
        return list(run(list(items)))
    except TASK_ERRORS:
        raise
    except Exception as error:
        if len(items) == 1:
            return [error]
    return [outcome for item in items for outcome in each_alone_on_failure(run, [item])]
