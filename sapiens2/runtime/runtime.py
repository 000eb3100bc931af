"""The task runner: runs registered tasks by name on photos with one model host (`runtime.host`), its model
steps in this process or across a device boundary (a ZeroGPU worker), as plain data either way."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sapiens2.models import hub, hub_access
from sapiens2.models.device import cpu_fallback_note
from sapiens2.outputs.results import TaskResult
from sapiens2.pipelines.context import PipelineContext
from sapiens2.pipelines.options import Option
from sapiens2.progress import Progress, within
from sapiens2.runtime.boundary import DeviceOutcome, DeviceWork
from sapiens2.runtime.host import COMPILE_ENV, DEFAULT_BATCH_SIZE, Host
from sapiens2.runtime.jobs import check_cancelled
from sapiens2.tasks.outputs import draw_result
from sapiens2.tasks.overview import values_from_earlier
from sapiens2.tasks.registry import ALL_TASKS, TASKS, Task, get_task
from sapiens2.vision.images import LoadedImage, load_image

__all__ = ["COMPILE_ENV", "DEFAULT_BATCH_SIZE", "Runtime"]


class _OfHost:
    """An attribute of the runner that is its host's, read and set there: callers holding the runner see
    the host's device, cache and forward (and a forward swapped on the runner is the one pipelines call)."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, runner: Runtime | None, owner: type | None = None) -> Any:
        return self if runner is None else getattr(runner.host, self.name)

    def __set__(self, runner: Runtime, value: Any) -> None:
        setattr(runner.host, self.name, value)


class Runtime:
    """Runs tasks by name on photos; models are loaded once, by its host, and shared by every task and
    caller."""

    def __init__(self, *, host: Host | None = None, **arguments: Any):
        """`host`: the model host to run on; else one built from `arguments`, the host's (device, dtype,
        detector, cache, batch_size, compile, setup, backend: see `Host`)."""
        self.host = host or Host(**arguments)
        # Where the model steps run: None in this process, by the host; else a function taking plain
        # DeviceWork to its DeviceOutcome where the models live (a ZeroGPU worker: sapiens2.serving.zerogpu).
        self.device_boundary: Callable[[DeviceWork], DeviceOutcome] | None = None

    # The host's, for callers that hold the runner (the app, the command line, videos).
    setup = _OfHost()
    device = _OfHost()
    dtype = _OfHost()
    dtype_reason = _OfHost()
    backend = _OfHost()
    compiled = _OfHost()
    batch_size = _OfHost()
    cache = _OfHost()
    cpu_fallbacks = _OfHost()
    device_label = _OfHost()
    dtype_label = _OfHost()
    resident = _OfHost()
    loads = _OfHost()
    model = _OfHost()
    config = _OfHost()
    settings = _OfHost()
    preload = _OfHost()
    use_device = _OfHost()
    detect = _OfHost()
    forward = _OfHost()

    def run_on_device(self, work: DeviceWork) -> DeviceOutcome:
        """The work's model steps, through the one device runner: by the host here, or across the device
        boundary when one is set (the photos already resized for the model on this side)."""
        if self.device_boundary is None:
            return self.host.run_work(work)
        for photo in work.photos:
            photo.image.model_rgb  # noqa: B018 - resized here, on the CPU, before the photo crosses
        return self.device_boundary(work)

    def prepare(self, repo_id: str, progress: Progress | None = None) -> None:
        """Make `repo_id` ready before a long job, so a missing or broken checkpoint fails first: loaded
        here, or, when the models live across a device boundary, its config read (the device loads it)."""
        if self.device_boundary is None:
            self.host.model(repo_id, progress)
        else:
            self.host.config(repo_id)

    def options(self, task: str) -> tuple[Option, ...]:
        """The options of `task` with their defaults for this runtime's device."""
        return get_task(task).options_on(self.device)

    def run(
        self,
        task: str,
        image: Any,
        *,
        size: str | None = None,
        model: str | None = None,
        model_name: str | None = None,
        progress: Progress | None = None,
        given: Mapping[str, Any] | None = None,
        pictures: bool = True,
        **options: Any,
    ) -> TaskResult:
        """Run `task` on one photo (a LoadedImage or anything `load_image` reads)."""
        given_all = None if given is None else [given]
        return self.run_batch(
            task,
            [image],
            size=size,
            model=model,
            model_name=model_name,
            progress=progress,
            given=given_all,
            pictures=pictures,
            **options,
        )[0]

    def run_batch(
        self,
        task: str,
        images: Sequence[Any],
        *,
        size: str | None = None,
        model: str | None = None,
        model_name: str | None = None,
        progress: Progress | None = None,
        given: Sequence[Mapping[str, Any] | None] | None = None,
        pictures: bool = True,
        **options: Any,
    ) -> list[TaskResult]:
        """Run `task` on several photos, batching them through the model; `pictures`: draw each result's
        pictures (else they are left to the caller, `sapiens2.tasks.draw_result`, or not drawn at all).

        `model` (a repo id, checkpoint folder or file) replaces the registry's checkpoint for `size`;
        `model_name` is what the results and their files call it (default: `model` itself).
        `given`: values each photo starts with (pose: `given_boxes`, Detections in photo pixels that replace
        the detector's), e.g. from a `FrameFollower` of a video.
        """
        entry = get_task(task)
        loaded = [image if isinstance(image, LoadedImage) else load_image(image) for image in images]
        context = PipelineContext(
            self.host,
            entry,
            model or entry.repo_id(size),
            entry.checked_options(options, self.device),
            progress,
            name=model_name if model else None,
        )
        pipeline = entry.pipeline
        photos = pipeline.started(context, loaded, given)
        first = pipeline.first_model_step
        if first < len(pipeline.steps):
            work = DeviceWork(entry.name, context.repo_id, context.options, first, photos, progress)
            self.run_on_device(work).applied_to(photos, context)
        results = pipeline.finished_all(context, photos)
        for operation in sorted(self.cpu_fallbacks):
            context.note(cpu_fallback_note(operation))
        for image, result in zip(loaded, results, strict=True):
            result.notes = list(image.notes) + context.notes + result.notes
            result.device, result.dtype = self.device_label, self.dtype_label
            if pictures:
                draw_result(result)
        return results

    def run_all(
        self, image: Any, *, size: str | None = None, progress: Progress | None = None
    ) -> list[TaskResult]:
        """Every picture task on one photo, sharing the cached models and the body-part labels (normals and
        depth mask their background with the body-part task's)."""
        loaded = image if isinstance(image, LoadedImage) else load_image(image)
        results = []
        for index, name in enumerate(ALL_TASKS):
            check_cancelled()
            task = TASKS[name]
            count = len(ALL_TASKS)
            step = within(progress, index / count, (index + 1) / count, f"{task.title}: ")
            results.append(self.run_after(name, loaded, results, size=size, progress=step))
        return results

    def run_after(
        self,
        task: str,
        image: LoadedImage,
        earlier: Sequence[TaskResult],
        *,
        size: str | None = None,
        progress: Progress | None = None,
    ) -> TaskResult:
        """One task of All tasks on `image` (at its own size for `size`, with default options), after the
        `earlier` results of the same photo, taking what it can from them (`values_from_earlier`)."""
        entry = get_task(task)
        own_size = entry.size_or_default(size)
        given = values_from_earlier(entry, entry.repo_id(own_size), earlier)
        return self.run(task, image, size=own_size, progress=progress, given=given)

    def offered_sizes(self, task: str) -> list[str]:
        """The model sizes to offer for `task`: every size while models can be downloaded; without the Hub
        (HF_HUB_OFFLINE, or no answer from it) the sizes whose files are on this server, else the default."""
        entry = get_task(task)
        if not hub_access.local_only():
            return list(entry.repos)
        here = [size for size in entry.repos if all(map(hub.is_here, entry.repo_ids_needed(size)))]
        return here or [entry.default_size]

    def missing_sizes_note(self, task: str) -> str | None:
        """What to fetch for the sizes `offered_sizes` leaves out, or None when it offers all of them."""
        entry, offered = get_task(task), self.offered_sizes(task)
        missing = [size for size in entry.repos if size not in offered]
        if not missing:
            return None
        fetch = ", ".join(entry.repo_id(size) for size in missing)
        return (
            "The Hub cannot be reached, so only the sizes whose files are on this server are listed. For "
            f"the others ({', '.join(missing)}), download {fetch} on a machine with internet access and copy "
            "them into the checkpoint folder (see the README's offline section)."
        )

    def download_note(self, task: str, size: str | None = None) -> str | None:
        """A sentence saying what the first use of this model will download, or None when it is local."""
        entry: Task = get_task(task)
        repo_ids = entry.repo_ids_needed(size)
        if self.device_boundary is not None:  # the models live on the device side, loaded per worker
            missing = [repo_id for repo_id in repo_ids if repo_id not in self.resident]
            if not missing:
                return None
            return (
                f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not kept loaded on this "
                "server: each run with this size loads it first, within the run's GPU time."
            )
        lines = []
        for repo_id in repo_ids:
            if repo_id in self.cache:
                continue
            if hub_access.local_only() and not hub.is_here(repo_id):
                return (
                    f"{repo_id} is not on this server and the Hub cannot be reached, so this size cannot "
                    f"run here. {hub.offline_instructions(repo_id)}"
                )
            remaining = hub.checkpoint_download_size(repo_id)
            if remaining == 0:
                continue
            amount = (
                f"{remaining / 1e9:.1f} GB" if remaining else f"about {entry.approx_download_gb(repo_id)}"
            )
            lines.append(f"{repo_id} ({amount})")
        if not lines:
            return None
        return "First use downloads " + " and ".join(lines) + "; later runs reuse it."
