"""The driver of `--ray`: list the photos, skip those already done, size the stages, run each task as one
Ray Data pipeline and print the command line's summary with per-stage times."""

from __future__ import annotations

import logging
import os
import secrets
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import pyarrow as pa
import ray
import ray.data

from sapiens2.batch.cluster.stages import (
    ROW,
    Job,
    ModelStage,
    cpu_stage,
    decode_stage,
    finish_stage,
    read_stage,
)
from sapiens2.batch.cluster.storage import Found, Place, existing_files, find_inputs, output_stems, place
from sapiens2.batch.cluster.tables import (
    FAILURE_COLUMNS,
    READ_STAGES,
    TableSink,
    Totals,
    failure,
    failures_dir,
    predictions_dir,
    read_column,
    remove_files,
    write_table,
)
from sapiens2.batch.cluster.videos import NOT_LOCAL, run_videos, runs_here
from sapiens2.batch.report import EXIT_NOTHING_SUCCEEDED, EXIT_OK, TASK_ERRORS, Report, count, reason
from sapiens2.batch.request import BatchRequest
from sapiens2.models.hub import use_checkpoint_dir
from sapiens2.settings import current, export

READ_WEIGHT = 0.25  # reading bytes waits on storage more than it computes
WAIT_FOR_ACTORS_S = 900


# ---- how much each stage reserves --------------------------------------------------------------------------


@dataclass(frozen=True)
class Sizing:
    """Reservations per stage: CPUs of each CPU stage's tasks; CPUs, GPUs and custom resources of each model
    actor; the actors per model stage (MIN, MAX)."""

    task_cpus: dict[str, float]
    actor_cpus: float
    actor_gpus: float
    actor_resources: dict[str, float]
    actors: tuple[int, int]


class SizingError(ValueError):
    """The cluster cannot hold the model actors asked for."""


def size_stages(
    cluster: Mapping[str, float],
    nodes: int,
    cpu_stages: Sequence[str],
    model_stages: int,
    actors: tuple[int, int] | None = None,
    resources: Mapping[str, float] | None = None,
    use_gpus: bool = True,
) -> Sizing:
    """Reservations that always leave room for one task of every CPU stage beside the largest actor pools.

    Model actors take at most half the cluster's CPUs (a quarter with GPUs, where the GPU does the work),
    split among them; what is left is split among the CPU stages, each at most one CPU (reading a quarter),
    with room for a second read task.
    With GPUs, each of a task's k model stages (pose: the detector and the pose model) takes 1/k of a GPU
    per actor, so one actor of each shares a GPU; custom resources are split the same way.
    """
    cpus, gpus = float(cluster.get("CPU", 0.0)), float(cluster.get("GPU", 0.0)) if use_gpus else 0.0
    low, high = actors or (1, max(1, int(gpus) if gpus >= 1 else nodes))
    total = high * model_stages
    actor_gpus = 1.0 / model_stages if gpus >= 1 else 0.0
    actor_cpus = min(1.0, cpus / ((4 if actor_gpus else 2) * total))
    free = cpus - actor_cpus * total
    weights = {name: READ_WEIGHT if name == "read" else 1.0 for name in cpu_stages}
    # One read task more than the rest may be waiting on slow storage without holding anything up.
    spread = sum(weights.values()) + READ_WEIGHT
    task_cpus = {name: min(weight, free * weight / spread) for name, weight in weights.items()}
    actor_resources = {name: amount / model_stages for name, amount in (resources or {}).items()}
    needs = {"GPU": actor_gpus, **actor_resources}
    for name, amount in needs.items():
        if amount and low * amount * model_stages > cluster.get(name, 0.0) + 1e-9:
            have = cluster.get(name, 0.0)
            raise SizingError(
                f"{low} model actor{'s' * (low != 1)} per stage need {low * amount * model_stages:g} {name}; "
                f"the cluster has {have:g}. Lower MIN in --actors MIN,MAX."
            )
    return Sizing(task_cpus, actor_cpus, actor_gpus, actor_resources, (low, high))


# ---- the run -----------------------------------------------------------------------------------------------

# Ray's settings the command chooses unless they are set: no usage statistics sent.
RAY_DEFAULTS = {"RAY_USAGE_STATS_ENABLED": "0"}


def quiet_ray_data() -> None:
    """Ray Data's messages on the console from warnings up: its plans and progress lines (one set every few
    seconds where the output is not a terminal) stay in its log file; the summary says what was done."""
    for handler in logging.getLogger("ray.data").handlers:
        if isinstance(handler, logging.StreamHandler):
            handler.setLevel(logging.WARNING)


@dataclass
class TaskRun:
    """One task's outcome: photos done now and before, the sink's totals and the wall time."""

    task: str
    todo: int = 0
    skipped: int = 0
    seconds: float = 0.0
    totals: Totals = field(default_factory=Totals)
    stopped: str | None = None


def _local_path(text: str | None) -> str | None:
    """A file or folder given on this machine, made absolute for workers; other names as they are."""
    return os.path.abspath(text) if text and os.path.exists(text) else text


def _task_error(error: BaseException) -> BaseException | None:
    """The model or detector failure inside an error raised by Ray, if that is what it is."""
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, TASK_ERRORS):
            return error
        seen.add(id(error))
        error = getattr(error, "cause", None) or error.__cause__
    return None


def _blocks(found: Sequence[Found], places: Sequence[tuple[str, str]], filesystems: list, size: int):
    """The photo rows as Arrow tables of `size` rows: each is one block, the unit of the read stage."""
    kinds = {id(fs): index for index, fs in enumerate(filesystems)}
    table = pa.table(
        {
            "source": [item.file.path for item in found],
            "fs": [kinds[id(item.file.filesystem)] for item in found],
            "label": [item.label for item in found],
            "directory": [directory for directory, _ in places],
            "stem": [stem for _, stem in places],
        }
    )
    assert tuple(table.column_names) == ROW
    return [table.slice(start, size) for start in range(0, len(table), size)]


def _dataset(job: Job, blocks: list[pa.Table], sizing: Sizing) -> ray.data.Dataset:
    """The task's stages, in order, each with its own reservation."""
    cpus = sizing.task_cpus
    dataset = ray.data.from_arrow(blocks)
    common = {"batch_format": "pandas", "fn_kwargs": {"job": job}, "batch_size": None}
    dataset = dataset.map_batches(read_stage, num_cpus=cpus["read"], **common)
    dataset = dataset.map_batches(decode_stage, num_cpus=cpus["decode"], **common)
    for index, (uses_model, steps) in enumerate(job.groups()):
        if uses_model:
            dataset = dataset.map_batches(
                ModelStage,
                fn_constructor_kwargs={"job": job, "group": index},
                batch_format="pandas",
                batch_size=job.batch_size,
                compute=ray.data.ActorPoolStrategy(min_size=sizing.actors[0], max_size=sizing.actors[1]),
                num_cpus=sizing.actor_cpus,
                num_gpus=sizing.actor_gpus,
                resources=sizing.actor_resources or None,
            )
        elif index:
            name = "+".join(step.name for step in steps)
            dataset = dataset.map_batches(
                cpu_stage,
                num_cpus=cpus[name],
                batch_format="pandas",
                batch_size=None,
                fn_kwargs={"job": job, "group": index},
            )
    return dataset.map_batches(finish_stage, num_cpus=cpus["finish"], **common)


def _cpu_stage_names(job: Job) -> list[str]:
    middle = [
        "+".join(s.name for s in steps) for i, (model, steps) in enumerate(job.groups()) if i and not model
    ]
    return ["read", "decode", *middle, "finish"]


def run(request: BatchRequest) -> int:
    """Run the request's tasks on the photos of its inputs with Ray Data; returns the exit status."""
    if request.checkpoint_dir is not None:
        use_checkpoint_dir(request.checkpoint_dir)
    out = place(str(request.out))
    started_here = not ray.is_initialized()
    if started_here:
        for name, value in RAY_DEFAULTS.items():
            export(name, value)
        ray.init(address=request.cluster.address or None, logging_level=logging.WARNING)
    quiet_ray_data()
    context = ray.data.DataContext.get_current()
    context.raise_original_map_exception = True  # a model or detector failure reads as itself
    # A cluster that cannot start MIN model actors gets an error, not an endless wait.
    context.wait_for_min_actors_s = WAIT_FOR_ACTORS_S
    try:
        return _run(request, out)
    finally:
        if started_here:
            ray.shutdown()


def _run(request: BatchRequest, out: Place) -> int:
    request = replace(request, detector=_local_path(request.detector), model=_local_path(request.model))
    run_id = f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"
    start = time.perf_counter()
    found, missing = find_inputs(request.inputs, out)
    places = output_stems(found, out)  # named among every input, as without --ray
    videos = [(item, spot) for item, spot in zip(found, places, strict=True) if item.is_video]
    elsewhere = [(item.label, NOT_LOCAL) for item, _ in videos if not runs_here(item, out)]
    videos = [(item, spot) for item, spot in videos if runs_here(item, out)]
    photos = [(item, spot) for item, spot in zip(found, places, strict=True) if not item.is_video]
    inputs_failures = [failure(what, "", "input", why) for what, why in missing + elsewhere]
    remove_files(out, failures_dir(out), "inputs-")
    if inputs_failures:
        write_table(
            pa.Table.from_pylist(inputs_failures, schema=FAILURE_COLUMNS),
            out,
            failures_dir(out),
            f"inputs-{run_id}",
        )
    plan = request.plan
    existing = existing_files(out)
    filesystems = list({id(item.file.filesystem): item.file.filesystem for item, _ in photos}.values())
    cluster = ray.cluster_resources()
    nodes = sum(1 for node in ray.nodes() if node.get("Alive"))
    where = f"{count(nodes, 'node')}, {cluster.get('CPU', 0):g} CPUs, {cluster.get('GPU', 0):g} GPUs"
    names = ", ".join(task.name for task in request.tasks)
    also = f" and {count(len(videos), 'video')}" if videos else ""
    print(f"{names} on {count(len(photos), 'photo')}{also} with Ray ({where}) -> {request.out}")
    # Options whose default depends on the device (pose's flip test) take the models' device.
    option_device = request.device or ("cuda" if cluster.get("GPU", 0) >= 1 else "cpu")
    unreadable: set[str] = set()
    runs = []
    for task in request.tasks:
        outcome = TaskRun(task.name)
        runs.append(outcome)
        remove_files(out, failures_dir(out), f"{task.name}-")
        if plan.overwrite:
            remove_files(out, predictions_dir(out, task.name))
        done = set(read_column(out, predictions_dir(out, task.name), "stem"))
        suffixes = plan.image_suffixes(task)
        todo = []
        for item, (directory, stem) in photos:
            if item.label in unreadable:
                continue
            key = out.relative(f"{directory}/{stem}")
            finished = key in done and all(f"{directory}/{stem}{suffix}" in existing for suffix in suffixes)
            if finished and not plan.overwrite:
                outcome.skipped += 1
            else:
                todo.append((item, (directory, stem)))
        outcome.todo = len(todo)
        if not todo:
            continue
        job = Job(
            task=task.name,
            repo_id=request.repo_id(task),
            options=task.checked_options(request.task_options(task), option_device),
            plan=plan,
            out=out,
            filesystems=tuple(filesystems),
            device=request.device,
            dtype=request.dtype,
            detector=request.detector,
            batch_size=request.batch_size,
            settings=current(),
        )
        try:
            sizing = size_stages(
                cluster,
                nodes,
                _cpu_stage_names(job),
                sum(model for model, _ in job.groups()),
                request.cluster.actors,
                dict(request.cluster.actor_resources),
                use_gpus=request.device != "cpu",
            )
        except ValueError as error:
            outcome.stopped = str(error)
            continue
        blocks = _blocks(
            [item for item, _ in todo], [spot for _, spot in todo], filesystems, request.batch_size
        )
        sink = TableSink(out, task.name, run_id)
        began = time.perf_counter()
        try:
            _dataset(job, blocks, sizing).write_datasink(sink)
        except Exception as error:
            stopped = _task_error(error)
            if stopped is None:
                raise
            outcome.stopped = reason(stopped)
        outcome.seconds = time.perf_counter() - began
        outcome.totals = sink.totals
        unreadable |= {f["path"] for f in sink.totals.failures if f["stage"] in READ_STAGES}
    played = Report()
    if videos:
        gpus = request.device != "cpu" and cluster.get("GPU", 0) >= 1
        played = run_videos(request, videos, current(), gpus)
    return _summary(runs, inputs_failures, time.perf_counter() - start, out, len(photos), played)


# ---- the summary -------------------------------------------------------------------------------------------

SHOWN_FAILURES = 20


def _summary(
    runs: list[TaskRun], inputs: list[dict], seconds: float, out: Place, photos: int, videos: Report
) -> int:
    """Print what was done, per task and per stage, then per video, and the failures; returns the exit
    status."""
    tables = out.shown(predictions_dir(out, "<task>")), out.shown(failures_dir(out))
    written = sum(r.totals.written for r in runs) + len(videos.written)
    kept = sum(r.totals.kept for r in runs) + videos.kept
    kept_text = f", {kept} already there (kept)" if kept else ""
    print(f"\nDone in {seconds:.1f} s: {count(written, 'file')} written to {out.text}{kept_text}.")
    failures = list(inputs)
    for r in runs:
        totals = r.totals
        failures += totals.failures
        if r.stopped:
            failures.append(failure(f"{r.task} (task stopped)", r.task, "model", r.stopped))
        parts = [count(totals.photos, "photo")]
        if totals.persons is not None:
            parts.append(f"{count(totals.persons, 'person')} found")
        if totals.photos and r.seconds:
            parts.append(f"{totals.photos / r.seconds:.2f} photos/s")
        if r.skipped:
            parts.append(f"{r.skipped} already done (skipped)")
        print(f"  {r.task}: {', '.join(parts)}")
        if totals.photos:
            stages = " · ".join(
                f"{name} {value / totals.photos:.3f}" for name, value in totals.seconds.items()
            )
            print(f"    seconds per photo: {stages}")
            print(f"    model stages ran on {count(len(totals.nodes), 'node')}")
    for line in videos.videos:
        print(f"  {line}")
    failures += [failure(what, "", "video", why) for what, why in videos.failures]
    # The failures table holds the inputs' and the photos' failures; it is written only when there are some.
    tabled = inputs or any(r.totals.failures for r in runs)
    failed = f" and {tables[1]}/ (one row per failure)" if tabled else ""
    print(f"Tables (Parquet): {tables[0]}/ (one row per photo){failed}.")
    if failures:
        print(f"{count(len(failures), 'failure')}:")
        for item in failures[:SHOWN_FAILURES]:
            print(f"  {item['path']}: {item['reason']}")
        if len(failures) > SHOWN_FAILURES:
            print(f"  ... and {len(failures) - SHOWN_FAILURES} more in {tables[1]}/")
    if videos.succeeded or any(r.totals.photos or r.skipped for r in runs):
        return EXIT_OK
    found = photos or videos.videos or videos.failures
    print("Nothing succeeded" + ("." if found else ": no photo or video was found."), file=sys.stderr)
    return EXIT_NOTHING_SUCCEEDED
