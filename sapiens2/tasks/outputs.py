"""A prediction's two readers, found through the registry: `draw` (its pictures) and `export` (its files)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from sapiens2.outputs.partial_files import make_folder
from sapiens2.outputs.results import Export, Pictures, Prediction, TaskOptions, TaskResult
from sapiens2.tasks.registry import TASKS, Task, get_task


def _entry(task: str | Task) -> Task:
    return task if isinstance(task, Task) else get_task(task)


def draw(
    task: str | Task,
    prediction: Prediction,
    options: Mapping[str, Any] | TaskOptions | None = None,
    titles: Iterable[str] | None = None,
) -> Pictures:
    """The task's pictures of `prediction` (title, uint8 RGB at the photo's size) in the registry's order,
    only those of `titles` (None: all); `options`: the task's options, or by name (missing ones: defaults)."""
    entry = _entry(task)
    options = entry.own_options(options or {})
    wanted = None if titles is None else set(titles)
    return [
        (picture.title, picture.draw(prediction, options))
        for picture in entry.pictures
        if wanted is None or picture.title in wanted
    ]


def export(
    task: str | Task,
    prediction: Prediction,
    kinds: Iterable[str] | None,
    folder: str | Path,
    stem: str,
    options: Mapping[str, Any] | TaskOptions | None = None,
) -> list[Path]:
    """Write the files of `prediction` that the task's `options` (or by name: missing ones take their
    defaults) choose, of the file types `kinds` ("json", "png", ...; None: every type), into `folder`,
    each named `stem` + its export's suffix; returns their paths. Every file or none: those written before
    a failure (a full disk) are removed."""
    entry = _entry(task)
    options = entry.own_options(options or {})
    return write_exports(entry.chosen_exports(options, kinds), prediction, options, Path(folder), stem)


def write_exports(
    exports: Sequence[Export], prediction: Prediction, options: TaskOptions, folder: Path, stem: str
) -> list[Path]:
    """Write `exports` of `prediction` into `folder` (see `export`); each file's name is checked against its
    export's suffix, so a task's declared files are the files it writes."""
    make_folder(folder)
    written: list[Path] = []
    try:
        for item in exports:
            paths = item.write(prediction, options, folder, stem)
            written += paths
            if [path.name for path in paths] != [f"{stem}{item.suffix}"]:
                raise RuntimeError(f"the export {item.suffix} wrote {[path.name for path in paths]}")
    except BaseException:
        for path in written:
            path.unlink(missing_ok=True)
        raise
    return written


def draw_result(result: TaskResult, titles: Iterable[str] | None = None) -> TaskResult:
    """`result` with its pictures of `titles` (None: all) drawn, those drawn before kept, in the registry's
    order; the time drawing took is counted in its timings."""
    order = get_task(result.task).picture_titles
    drawn = dict(result.pictures)
    missing = [title for title in (order if titles is None else titles) if title not in drawn]
    if missing:
        with result.timings.measure("pictures"):
            drawn.update(draw(result.task, result.prediction, result.options, missing))
        result.pictures = [(title, drawn[title]) for title in order if title in drawn]
    return result


def export_result(
    result: TaskResult, folder: str | Path, stem: str, kinds: Iterable[str] | None = None
) -> list[Path]:
    """Write the files the result's options choose, of the file types `kinds` (None: all); see `export`."""
    return export(result.task, result.prediction, kinds, folder, stem, result.options)


def view_result(result: TaskResult, folder: str | Path, stem: str) -> Path | None:
    """Write the file a 3-D viewer shows of `result` (depth: the mesh's preview); None for a task without."""
    entry = get_task(result.task)
    return None if entry.view is None else entry.view(result.prediction, Path(folder), stem)


def export_kinds() -> tuple[str, ...]:
    """Every file type a task or a video's frame log writes: "json", "png", "npy", "ply", "glb"."""
    kinds = []
    for task in TASKS.values():
        kinds += task.export_kinds
        if task.frame_log is not None:
            kinds.append(task.frame_log.suffix.rsplit(".", 1)[-1])
    return tuple(dict.fromkeys(kinds))
