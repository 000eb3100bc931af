"""What a batch run writes for each input (export kinds, pictures, videos), and a photo's files written."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sapiens2.batch.inputs import Source
from sapiens2.batch.video import video_outputs
from sapiens2.outputs.exports import write_picture
from sapiens2.outputs.results import TaskResult
from sapiens2.tasks import Task, draw_result, export_kinds
from sapiens2.tasks.outputs import write_exports

EXPORT_KINDS = export_kinds()  # "json", "png", "npy", "ply", "glb": the types of the files the tasks write
NAME_MAX, PATH_MAX = 255, 4095  # bytes of one part of a path and of a whole path (Linux)


@dataclass(frozen=True)
class Plan:
    """What to write: export kinds (json, png, npy, ply, glb), whether to write pictures, the videos'
    format, and the task options by name (some choose files: pose's keypoint formats)."""

    exports: frozenset[str]
    pictures: bool
    overwrite: bool
    video_format: str = "webm"
    options: Mapping[str, Any] = field(default_factory=dict)

    def export_suffixes(self, task: Task) -> list[str]:
        """What follows a photo's stem in the names of the exports it gets from `task`."""
        return list(task.exports_for(self.options, self.exports))

    def picture_suffixes(self, task: Task) -> dict[str, str]:
        """Picture title -> file suffix; a picture whose content an export writes is left to that export."""
        if not self.pictures:
            return {}
        exports = set(self.export_suffixes(task))
        return {picture.title: picture.suffix for picture in task.pictures if picture.same_as not in exports}

    def image_suffixes(self, task: Task) -> list[str]:
        """What follows a photo's stem in the names of the files it gets from `task`."""
        return self.export_suffixes(task) + [f"{s}.png" for s in self.picture_suffixes(task).values()]

    def image_outputs(self, task: Task, source: Source) -> list[Path]:
        return [source.directory / f"{source.stem}{suffix}" for suffix in self.image_suffixes(task)]

    def outputs(self, task: Task, source: Source) -> list[Path]:
        """Every file the source is to get from `task`."""
        if not source.is_video:
            return self.image_outputs(task, source)
        log_kind = task.frame_log.suffix.rsplit(".", 1)[-1] if task.frame_log else None
        writes = {"write_video": self.pictures, "write_log": log_kind in self.exports}
        place = (task, source.directory, source.stem)
        return video_outputs(*place, video_format=self.video_format, options=self.options, **writes)

    def pending(self, task: Task, source: Source) -> bool:
        """True when the source has outputs of `task` to write (all of them, with overwrite)."""
        paths = self.outputs(task, source)
        return bool(paths) and (self.overwrite or not all(path.exists() for path in paths))


def write_image_outputs(result: TaskResult, task: Task, source: Source, plan: Plan) -> tuple[list[Path], int]:
    """Write the planned exports and pictures of one photo; returns the files written and those kept.

    Only what is planned and missing (or everything, with overwrite) is written, and only the pictures
    written are drawn. Every file or none: those written before a failure are removed.
    """
    folder, stem = source.directory, source.stem

    def missing(suffix: str) -> bool:
        return plan.overwrite or not (folder / f"{stem}{suffix}").exists()

    exports = task.chosen_exports(plan.options, plan.exports)
    pictures = plan.picture_suffixes(task)
    todo = [export for export in exports if missing(export.suffix)]
    titles = [title for title, suffix in pictures.items() if missing(f"{suffix}.png")]
    kept = len(exports) - len(todo) + len(pictures) - len(titles)
    written = write_exports(todo, result.prediction, task.own_options(result.options), folder, stem)
    try:
        drawn = dict(draw_result(result, titles).pictures) if titles else {}
        for title in titles:
            written += write_picture(folder, stem, pictures[title], drawn[title])
    except BaseException:
        for path in written:
            path.unlink(missing_ok=True)
        raise
    return written, kept


def too_long(path: Path) -> bool:
    """True when the system cannot name `path`: a part above 255 bytes or the whole above 4095."""
    encoded = [len(os.fsencode(part)) for part in path.parts]
    return max(encoded, default=0) > NAME_MAX or len(os.fsencode(str(path))) > PATH_MAX
