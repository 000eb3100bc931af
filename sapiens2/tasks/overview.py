"""All tasks on one photo: what a task can take from the results of the tasks before it on the same photo."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sapiens2.outputs.results import TaskResult
from sapiens2.pipelines.segment import SegmentationPrediction
from sapiens2.tasks.registry import Task


def values_from_earlier(task: Task, repo_id: str, earlier: Sequence[TaskResult]) -> Mapping[str, Any] | None:
    """The values `task`, run with `repo_id`'s checkpoint, can start with from `earlier` results of the same
    photo: its helper body-part model's class ids when an earlier result is that very checkpoint's, so the
    model does not run on the photo a second time (All tasks: normals and depth mask their background with
    the body-part task's labels). None when nothing fits."""
    helper = task.helper_repo_id(repo_id)
    if helper is None:
        return None
    for result in earlier:
        if result.model_id == helper and isinstance(result.prediction, SegmentationPrediction):
            return {"given_body_parts": result.prediction.labels}
    return None
