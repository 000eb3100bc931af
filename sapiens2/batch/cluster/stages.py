"""The Ray Data stages of a task, each a plain function or class over pandas batches of photo rows.

A row carries its input (`source`, `fs`, `label`), its output place (`directory`, `stem`), then the bytes,
the `Photo` on its way through the task's steps, and `error`/`stage` once something went wrong: a failed
row passes through every later stage untouched and becomes a row of the failures table. Between stages a
row travels whole, as one packed value.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd
import pyarrow.fs as pafs

from sapiens2.batch.cluster.storage import Place, read_bytes, write_outputs
from sapiens2.batch.cluster.tables import RECORD, failure, packed, unpacked
from sapiens2.batch.cluster.worker import start_worker
from sapiens2.batch.plan import Plan
from sapiens2.batch.report import TASK_ERRORS, reason
from sapiens2.batch.retry import each_alone_on_failure
from sapiens2.outputs.results import TaskOptions, TaskResult
from sapiens2.pipelines.context import PipelineContext
from sapiens2.pipelines.steps import Photo, Step
from sapiens2.runtime.boundary import DeviceWork
from sapiens2.runtime.host import Host
from sapiens2.settings import Settings, install
from sapiens2.tasks.registry import Task, get_task
from sapiens2.vision.images import load_image


@dataclass(frozen=True)
class Job:
    """One task over the photos: everything a stage needs, sent once to each worker."""

    task: str
    repo_id: str
    options: TaskOptions  # the task's own, checked
    plan: Plan
    out: Place
    filesystems: tuple[pafs.FileSystem, ...]  # the inputs' filesystems; a row names its own by index
    device: str | None
    dtype: str | None
    detector: str | None
    batch_size: int
    settings: Settings  # the command's settings, for every worker

    @property
    def entry(self) -> Task:
        return get_task(self.task)

    def context(self, host: Host) -> PipelineContext:
        install(self.settings)
        return PipelineContext(host, self.entry, self.repo_id, self.options)

    def groups(self) -> list[tuple[bool, tuple[Step, ...]]]:
        return self.entry.pipeline.groups()

    def step_range(self, group: int) -> tuple[int, int]:
        """The indices of the group's first step and of the step after its last."""
        groups = self.groups()
        first = sum(len(steps) for _, steps in groups[:group])
        return first, first + len(groups[group][1])


@functools.cache
def _cpu_host(settings: Settings) -> Host:
    """A worker's host for CPU steps: its processor settings, read once per worker, and never a model."""
    return Host(device="cpu", setup=settings)


def _cpu_context(job: Job) -> PipelineContext:
    return job.context(_cpu_host(job.settings))


ROW = ("source", "fs", "label", "directory", "stem")
ROWS = "rows"  # between stages, each row travels whole as one value (see `packed`)


def _rows(batch: pd.DataFrame) -> list[dict[str, Any]]:
    if ROWS in batch:
        return [unpacked(data) for data in batch[ROWS]]
    return batch.to_dict("records")  # the first stage: the input columns of `ROW`


def _frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """The rows as a batch of one column of bytes, which Ray moves between its workers as they are."""
    return pd.DataFrame({ROWS: pd.Series([packed(row) for row in rows], dtype=object)})


def _failed(row: dict[str, Any], stage: str, error: BaseException | str) -> None:
    row["error"] = error if isinstance(error, str) else reason(error)
    row["stage"] = stage
    row.pop("photo", None)


def read_stage(batch: pd.DataFrame, job: Job) -> pd.DataFrame:
    """Each photo's bytes, read from its filesystem."""
    rows = _rows(batch)
    for row in rows:
        start = time.perf_counter()
        try:
            row["data"] = read_bytes(job.filesystems[row["fs"]], row["source"])
        except Exception as error:  # a vanished file, a permission, a network error: this photo only
            _failed(row, "read", f"The file could not be read: {reason(error)}")
        row["read_s"] = time.perf_counter() - start
    return _frame(rows)


def decode_stage(batch: pd.DataFrame, job: Job) -> pd.DataFrame:
    """Bytes to a clean photo (the package's input hygiene), then the task's leading CPU steps."""
    rows = _rows(batch)
    context = _cpu_context(job)
    uses_model, steps = job.groups()[0]
    for row in rows:
        data = row.pop("data", None)
        if row.get("error"):
            continue
        start = time.perf_counter()
        try:
            image = load_image(data)
            image.model_rgb  # noqa: B018 - computed here, on a CPU worker, rather than by the model stage
        except Exception as error:
            _failed(row, "decode", error)
            continue
        finally:
            row["decode_s"] = time.perf_counter() - start
        row["photo"] = job.entry.pipeline.photo(image)
        if not uses_model:
            _cpu_steps(row, steps, context)
    return _frame(rows)


def _cpu_steps(row: dict[str, Any], steps: Sequence[Step], context: PipelineContext) -> None:
    try:
        for step in steps:
            step.apply(context, [row["photo"]])
    except TASK_ERRORS:
        raise
    except Exception as error:
        _failed(row, steps[0].name, error)


def cpu_stage(batch: pd.DataFrame, job: Job, group: int) -> pd.DataFrame:
    """A group of CPU steps between two model stages (pose: the person crops)."""
    rows = _rows(batch)
    context = _cpu_context(job)
    for row in rows:
        if not row.get("error"):
            _cpu_steps(row, job.groups()[group][1], context)
    return _frame(rows)


class ModelStage:
    """An actor holding a model host for a group of model steps (its models loaded once), run on batches of
    photos."""

    def __init__(self, job: Job, group: int) -> None:
        import ray
        import torch

        self.job, self.steps = job, job.groups()[group][1]
        start_worker(job.settings)
        self.first, self.stop = job.step_range(group)
        self.host = Host(
            device=job.device,
            dtype=job.dtype,
            detector=job.detector,
            batch_size=job.batch_size,
            setup=job.settings,
        )
        if self.host.device.type == "cpu":
            # Ray starts workers with one thread per reserved CPU; a model on CPUs uses the node's cores.
            torch.set_num_threads(len(os.sched_getaffinity(0)))
        self.node = ray.get_runtime_context().get_node_id()

    def __call__(self, batch: pd.DataFrame) -> pd.DataFrame:
        """The group's steps on the batch's photos; when the batch fails, each photo is tried alone, as
        without --ray."""
        rows = _rows(batch)
        todo = [row for row in rows if not row.get("error")]
        outcomes = each_alone_on_failure(self._run, [row["photo"] for row in todo])
        for row, outcome in zip(todo, outcomes, strict=True):
            if isinstance(outcome, Exception):
                _failed(row, self.steps[0].name, outcome)
            else:
                row["photo"] = outcome
                row["nodes"] = [*(row.get("nodes") or []), self.node]
        return _frame(rows)

    def _run(self, photos: list[Photo]) -> list[Photo]:
        """The photos after the group's steps, run by the one device runner (their values on the CPU)."""
        job = self.job
        attempt = [
            dataclasses.replace(photo, values=copy.copy(photo.values), seconds=dict(photo.seconds))
            for photo in photos
        ]
        work = DeviceWork(job.task, job.repo_id, job.options, self.first, attempt, stop=self.stop)
        outcome = self.host.run_work(work, portable=True)
        if outcome.error is not None:
            raise outcome.error
        return [
            dataclasses.replace(photo, values=part.values, timings=part.timings, seconds=part.seconds)
            for photo, part in zip(attempt, outcome.photos, strict=True)
        ]


def finish_stage(batch: pd.DataFrame, job: Job) -> pd.DataFrame:
    """Each photo's result, its files written, and its row for the tables (as `record`)."""
    rows = _rows(batch)
    context = _cpu_context(job)
    context.settings()  # its notes for every photo (a model run at another size than it was built for)
    records = []
    for row in rows:
        if not row.get("error"):
            try:
                result = job.entry.pipeline.finished(context, row["photo"])
            except TASK_ERRORS:
                raise
            except Exception as error:
                _failed(row, "finish", error)
        if not row.get("error"):
            start = time.perf_counter()
            try:
                place = (row["directory"], row["stem"])
                written, _ = write_outputs(result, job.entry, job.plan, job.out, *place)
            except Exception as error:
                _failed(row, "write", f"Its outputs could not be written: {reason(error)}")
            else:
                seconds = time.perf_counter() - start
                records.append(_record(row, job, result, context.notes, written, seconds))
                continue
        records.append(failure(row["label"], job.task, row["stage"], row["error"]))
    return pd.DataFrame({RECORD: pd.Series([packed(record) for record in records], dtype=object)})


def _record(
    row: dict[str, Any], job: Job, result: TaskResult, notes: list[str], written: list[str], write_s: float
) -> dict:
    """The photo's row of the predictions table, with what the sink sums."""
    photo: Photo = row["photo"]
    task = job.entry
    height, width = photo.image.original_size
    outputs = [f"{row['directory']}/{row['stem']}{suffix}" for suffix in job.plan.image_suffixes(task)]
    return {
        "path": row["label"],
        "stem": job.out.relative(f"{row['directory']}/{row['stem']}"),
        "width": width,
        "height": height,
        "persons": result.persons,
        "outputs": [job.out.shown(path) for path in outputs],
        "notes": list(photo.image.notes) + notes + result.notes,
        "model": result.model_id,
        "nodes": row.get("nodes") or [],
        "seconds": {"read": row["read_s"], "decode": row["decode_s"], **photo.seconds, "write": write_s},
        "columns": dict(task.columns(result)) if task.columns else {},
        "written": len(written),
    }
