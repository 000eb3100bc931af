"""The task registry: every task declared once (its kind, options, pictures, exports, pipeline), and the
fine-tuned checkpoints offered beside a task's official sizes.

Imports `sapiens2.pipelines` and everything below it."""

from sapiens2.tasks.registry import (
    ALL_TASKS,
    TASKS,
    Picture,
    Task,
    all_sizes,
    get_task,
    options_by_name,
    video_options,
)

__all__ = [
    "ALL_TASKS",
    "TASKS",
    "Picture",
    "Task",
    "all_sizes",
    "get_task",
    "options_by_name",
    "video_options",
]
