"""The task registry: every task declared once (its kind, options, pictures, exports, pipeline), the
pictures and files of its predictions (`draw`, `export`), and the fine-tuned checkpoints offered beside a
task's official sizes.

Imports `sapiens2.pipelines` and everything below it."""

from sapiens2.tasks.outputs import draw, draw_result, export, export_kinds, export_result, view_result
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
    "draw",
    "draw_result",
    "export",
    "export_kinds",
    "export_result",
    "get_task",
    "options_by_name",
    "video_options",
    "view_result",
]
