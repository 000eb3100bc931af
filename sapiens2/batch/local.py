"""The batch run on this machine: every task over the inputs, photos in batches, videos frame by frame."""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from huggingface_hub.utils import tqdm  # the tqdm that huggingface_hub, a dependency, ships with

from sapiens2.batch.inputs import Source, collect_sources
from sapiens2.batch.plan import too_long, write_image_outputs
from sapiens2.batch.report import (
    EXIT_NOTHING_SUCCEEDED,
    EXIT_OK,
    TASK_ERRORS,
    Report,
    TaskStats,
    count,
    print_summary,
    reason,
)
from sapiens2.batch.request import BatchRequest
from sapiens2.batch.retry import each_alone_on_failure
from sapiens2.batch.video import (
    VIDEO_FORMATS,
    VideoError,
    VideoJob,
    planned_frames,
    process_video,
    video_info,
)
from sapiens2.outputs.results import TaskResult
from sapiens2.runtime import Runtime
from sapiens2.tasks import Task
from sapiens2.tasks.overview import values_from_earlier
from sapiens2.vision.images import ImageInputError, LoadedImage, load_image


def run_locally(request: BatchRequest, runtime: Runtime) -> int:
    """Run the request's tasks on its inputs with `runtime`, print the summary; returns the exit status."""
    out = Path(request.out)
    sources, missing = collect_sources(request.inputs, out)
    run = Run(runtime, request)
    for what, why in missing:
        run.report.fail(what, why)
    start = time.perf_counter()
    names = ", ".join(task.name for task in request.tasks)
    where = f"{runtime.device_label}, {runtime.dtype_label}"
    print(f"{names} on {count(len(sources), 'file')} ({where}) -> {out}")
    run.tasks(request.tasks, sources)
    print_summary(run.report, time.perf_counter() - start, out)
    if run.report.succeeded:
        return EXIT_OK
    print("Nothing succeeded" + ("." if sources else ": no image or video was found."), file=sys.stderr)
    return EXIT_NOTHING_SUCCEEDED


@dataclass
class Run:
    """Runs tasks over sources and fills a report."""

    runtime: Runtime
    request: BatchRequest
    report: Report = field(default_factory=Report)
    unreadable: set[Path] = field(default_factory=set)

    @property
    def plan(self):
        return self.request.plan

    def task(self, task: Task, sources: Sequence[Source]) -> None:
        """Run one task on every source that still needs it; a model or detector failure stops the task."""
        self.tasks([task], sources)

    def tasks(self, tasks: Sequence[Task], sources: Sequence[Source]) -> None:
        """Run the tasks on every source that still needs them: the photos a batch at a time, each batch read
        once and run through every task in turn (so a task takes what it can from the earlier tasks' results
        of the same photo: normals and depth the body-part task's labels); then the videos, task by task. A
        model or detector failure stops its task, and only that one."""
        todo = {task.name: self.pending(task, sources) for task in tasks}
        stopped: set[str] = set()
        photos = {name: [source for source in found if not source.is_video] for name, found in todo.items()}
        self.images(tasks, sources, photos, stopped)
        for task in tasks:
            if task.name in stopped:
                continue
            try:
                for source in todo[task.name]:
                    if source.is_video and source.path not in self.unreadable:
                        self.video(task, source)
            except TASK_ERRORS as error:
                self.stop(task, error, stopped)

    def pending(self, task: Task, sources: Sequence[Source]) -> list[Source]:
        """The sources `task` still has to run on; those with outputs already there are counted as kept, and
        a source whose output names would be too long fails (once) before any model runs."""
        readable = [source for source in sources if source.path not in self.unreadable]
        for source in readable:
            if any(too_long(path) for path in self.plan.outputs(task, source)):
                self.unreadable.add(source.path)
                self.report.fail(source.label, "Its output file names would be too long for this system.")
        readable = [source for source in readable if source.path not in self.unreadable]
        todo = [source for source in readable if self.plan.pending(task, source)]
        for source in set(readable) - set(todo):
            outputs = self.plan.outputs(task, source)
            self.report.succeeded += bool(outputs)
            self.report.kept += len(outputs)
        return todo

    def images(
        self,
        tasks: Sequence[Task],
        sources: Sequence[Source],
        todo: Mapping[str, Sequence[Source]],
        stopped: set[str],
    ) -> None:
        """The photos of `todo` (task name -> sources) in batches, in the order of `sources`: each batch read
        once, then run through every task that has photos in it, in the tasks' order."""
        total = sum(map(len, todo.values()))
        if not total:
            return
        for task in tasks:  # the summary's lines in the tasks' order
            if todo[task.name]:
                self.report.stats.setdefault(task.name, TaskStats())
        wanted = {name: {source.path for source in found} for name, found in todo.items()}
        needed = set().union(*wanted.values())
        photos = [source for source in sources if source.path in needed]
        batch_size = self.request.batch_size
        names = ", ".join(task.name for task in tasks if todo[task.name])
        with tqdm(total=total, desc=names, unit="image", leave=False) as bar:
            for start in range(0, len(photos), batch_size):
                part = photos[start : start + batch_size]
                batch = self.loaded([source for source in part if source.path not in self.unreadable])
                earlier: dict[Path, list[TaskResult]] = {}
                for index, task in enumerate(tasks):
                    pairs = [(source, image) for source, image in batch if source.path in wanted[task.name]]
                    if pairs and task.name not in stopped:
                        self.batch(task, pairs, earlier, tasks[index + 1 :], stopped)
                    bar.update(sum(source.path in wanted[task.name] for source in part))

    def batch(
        self,
        task: Task,
        pairs: list[tuple[Source, LoadedImage]],
        earlier: dict[Path, list[TaskResult]],
        later: Sequence[Task],
        stopped: set[str],
    ) -> None:
        """One task on a batch of photos, its results written and counted; those a `later` task takes from
        are added to `earlier`. A model or detector failure stops the task (added to `stopped`)."""
        try:
            done = self.results(task, pairs, earlier)
        except TASK_ERRORS as error:
            self.stop(task, error, stopped)
            return
        for source, result in done:
            self.count(result, task, source)
            if self.useful_later(result, later):  # without its pictures, drawn to be written
                earlier.setdefault(source.path, []).append(replace(result, pictures=[]))

    def stop(self, task: Task, error: BaseException, stopped: set[str]) -> None:
        """A failure of the task itself (its checkpoint, its detector): reported once, and the task stops."""
        stopped.add(task.name)
        self.report.fail(f"{task.name} (task stopped)", error)

    def count(self, result: TaskResult, task: Task, source: Source) -> None:
        """Write a result's files (drawing the pictures it writes) and count it in the task's figures."""
        self.save(result, task, source)
        stats = self.report.stats.setdefault(task.name, TaskStats())
        stats.images += 1
        stats.seconds += result.timings.total
        if result.persons is not None:
            stats.persons = (stats.persons or 0) + result.persons

    def useful_later(self, result: TaskResult, later: Sequence[Task]) -> bool:
        """Whether one of the `later` tasks takes values from `result` (kept until the batch is done)."""
        return any(
            values_from_earlier(task, self.request.repo_id(task), [result]) is not None for task in later
        )

    def loaded(self, sources: Sequence[Source]) -> list[tuple[Source, LoadedImage]]:
        """The photos that can be read; the others are reported once and left out of later tasks."""
        loaded = []
        for source in sources:
            try:
                loaded.append((source, load_image(source.path)))
            except (ImageInputError, OSError) as error:
                self.unreadable.add(source.path)
                self.report.fail(source.label, error)
        return loaded

    def results(
        self,
        task: Task,
        batch: list[tuple[Source, LoadedImage]],
        earlier: Mapping[Path, Sequence[TaskResult]],
    ) -> list[tuple[Source, TaskResult]]:
        """(source, result) pairs of a batch, each photo starting with what it takes from its `earlier`
        results; when the batch fails, each photo is tried alone."""
        repo_id = self.request.repo_id(task)

        def run(pairs: list[tuple[Source, LoadedImage]]) -> list[TaskResult]:
            given = [values_from_earlier(task, repo_id, earlier.get(source.path, ())) for source, _ in pairs]
            return self.runtime.run_batch(
                task.name,
                [image for _, image in pairs],
                size=task.size_or_default(self.request.size),
                model=self.request.model,
                given=None if all(values is None for values in given) else given,
                pictures=False,  # drawn when written, those planned only
                **self.request.task_options(task),
            )

        pairs = []
        for (source, _), outcome in zip(batch, each_alone_on_failure(run, batch), strict=True):
            if isinstance(outcome, Exception):
                self.report.fail(source.label, outcome)
            else:
                pairs.append((source, outcome))
        return pairs

    def save(self, result: TaskResult, task: Task, source: Source) -> None:
        try:
            written, kept = write_image_outputs(result, task, source, self.plan)
        except Exception as error:
            self.report.fail(source.label, f"Its outputs could not be written: {reason(error)}")
            return
        self.report.written += written
        self.report.kept += kept
        self.report.succeeded += 1

    def video(self, task: Task, source: Source) -> None:
        request = self.request
        missing = [
            path for path in self.plan.outputs(task, source) if self.plan.overwrite or not path.exists()
        ]
        is_video = [path.suffix[1:] in VIDEO_FORMATS for path in missing]
        job = VideoJob(
            task.name,
            source.path,
            source.directory,
            size=task.size_or_default(request.size),
            model=request.model,
            options=request.task_options(task, videos=True),
            stem=source.stem,
            max_seconds=None,
            max_frames=request.max_frames,
            stride=request.stride,
            batch_size=request.batch_size,
            video_format=self.plan.video_format,
            write_video=any(is_video),
            write_log=not all(is_video),
        )
        try:
            info = video_info(source.path)
            total = planned_frames(info, stride=request.stride, max_frames=request.max_frames)
            with tqdm(total=total, desc=f"{task.name} {source.path.name}", unit="frame", leave=False) as bar:

                def progress(fraction: float, _: str) -> None:
                    bar.update(round(fraction * (total or 0)) - bar.n)

                result = process_video(self.runtime, job, progress)
        except TASK_ERRORS:
            raise
        except Exception as error:
            if isinstance(error, VideoError):
                self.unreadable.add(source.path)
            self.report.fail(source.label, error)
            return
        self.report.written += result.files
        self.report.kept += len(self.plan.outputs(task, source)) - len(missing)
        self.report.succeeded += 1
        persons = "" if result.persons is None else f", {count(result.persons, 'person')}"
        notes = "".join(f". {note}" for note in result.notes)
        self.report.videos.append(
            f"{source.label}, {task.name}: {result.frames} frames in {result.seconds:.1f} s, "
            f"{result.frames_per_second:.2f} frames/s{persons}{notes}"
        )
