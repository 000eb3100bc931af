"""The runtime: one device, one model cache and one person detector, running registered tasks on photos."""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from sapiens2.errors import ConfigError
from sapiens2.models import hub, hub_access
from sapiens2.models.config import Sapiens2Config
from sapiens2.models.device import (
    MPS_WITHOUT_FALLBACK,
    choose_dtype,
    cpu_fallback_note,
    dtype_name,
    mps_fallback_active,
    recording_cpu_fallbacks,
    resolve_device,
    synchronize,
)
from sapiens2.models.kinds import ModelKind
from sapiens2.outputs.results import TaskResult
from sapiens2.pipelines.context import PipelineContext
from sapiens2.pipelines.options import Option
from sapiens2.pipelines.steps import Photo
from sapiens2.progress import Progress, within
from sapiens2.runtime.boundary import DeviceOutcome, DeviceWork, run_device_work
from sapiens2.runtime.cache import ModelCache, budget_from_env
from sapiens2.runtime.jobs import check_cancelled
from sapiens2.runtime.onnx_backend import BACKENDS, ONNXRUNTIME, TORCH, load_onnxruntime, missing_onnxruntime
from sapiens2.settings import Settings, current
from sapiens2.tasks.outputs import draw_result
from sapiens2.tasks.registry import ALL_TASKS, TASKS, Task, get_task, model_bytes_estimate
from sapiens2.vision.detector import Detections, PersonDetector, YoloPersonDetector
from sapiens2.vision.images import LoadedImage, load_image
from sapiens2.vision.processing import ProcessorSettings, size_text

log = logging.getLogger("sapiens2.runtime")

DEFAULT_BATCH_SIZE = 8
COMPILE_ENV = "SAPIENS2_COMPILE"


def load_compiled(repo_id: str, **kwargs: Any) -> nn.Module:
    """`hub.from_pretrained`, then torch.compile on the model in place (names and attributes unchanged).
    Compiling happens on the first forward of each input shape: tens of seconds to minutes, once."""
    model = hub.from_pretrained(repo_id, **kwargs)
    model.compile()
    return model


def choose_backend(backend: str | None, device: torch.device, dtype: str | None) -> str:
    """The backend that runs the forwards: `backend` when it can run on `device` in `dtype`, else "torch"."""
    backend = backend or TORCH
    if backend not in BACKENDS:
        raise ConfigError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if backend == ONNXRUNTIME:
        if device.type != "cpu":
            raise ConfigError(f"the ONNX Runtime backend runs on the CPU, not on {device.type}")
        if dtype not in (None, "fp32", "float32"):
            raise ConfigError(f"the ONNX Runtime backend runs in fp32, not {dtype}")
        missing = missing_onnxruntime()
        if missing is not None:
            raise ConfigError(f"the ONNX Runtime backend needs {missing}")
    return backend


class Runtime:
    """Runs tasks by name on photos; models are loaded once and shared by every task and caller."""

    def __init__(
        self,
        *,
        device: str | None = None,
        dtype: str | None = None,
        detector: str | os.PathLike | PersonDetector | None = None,
        cache: ModelCache | None = None,
        batch_size: int = DEFAULT_BATCH_SIZE,
        compile: bool | None = None,
        setup: Settings | None = None,
        backend: str | None = None,
    ):
        """`compile` (default: SAPIENS2_COMPILE) runs every model through torch.compile; `setup`: the settings
        the arguments left unsaid come from (the settings in force when None); `backend` "onnxruntime" runs
        the forwards in ONNX Runtime on the CPU, in float32 (default "torch")."""
        self.setup = setup or current()
        self.device = resolve_device(device or self.setup.device)
        self.backend = choose_backend(backend, self.device, dtype)
        if self.backend == ONNXRUNTIME:
            self.dtype, self.dtype_reason = torch.float32, "ONNX Runtime runs the exported float32 model"
        else:
            self.dtype, self.dtype_reason = choose_dtype(dtype, self.device, self.setup.dtype)
        self.compiled = self.setup.compile if compile is None else compile
        if batch_size < 1:
            raise ConfigError(f"batch size must be at least 1, got {batch_size}")
        self.batch_size = batch_size
        loader = load_compiled if self.compiled else hub.from_pretrained
        self.cache = cache or ModelCache(
            load_onnxruntime if self.backend == ONNXRUNTIME else loader,
            device=self.device,
            dtype=self.dtype,
            budget_bytes=budget_from_env(self.device, self.setup),
            estimate=lambda repo_id: model_bytes_estimate(repo_id, self.dtype),
        )
        # A detector object is used as given; a model name or .pt path (or None) is loaded on first use.
        by_name = detector is None or isinstance(detector, (str, os.PathLike))
        self._detector_source = detector if by_name else None
        self._builds_detector = by_name
        self._detector: PersonDetector | None = None if by_name else detector
        self._detector_lock = threading.Lock()
        self._settings: dict[str, ProcessorSettings] = {}
        self._configs: dict[str, Sapiens2Config] = {}
        # Where the model steps run: None in this process; else a function taking plain DeviceWork to its
        # DeviceOutcome somewhere the models live (a ZeroGPU worker: sapiens2.serving.zerogpu).
        self.device_boundary: Callable[[DeviceWork], DeviceOutcome] | None = None
        # The operations PyTorch has run on the CPU because the Apple GPU (MPS) has no kernel for them.
        self.cpu_fallbacks: set[str] = set()
        if self.device.type == "mps" and not mps_fallback_active():
            log.warning(MPS_WITHOUT_FALLBACK)

    @property
    def device_label(self) -> str:
        return self.device.type if self.device.index is None else str(self.device)

    @property
    def dtype_label(self) -> str:
        return dtype_name(self.dtype)

    @property
    def resident(self) -> frozenset[str]:
        """The models loaded at start-up and kept (`preload`)."""
        return self.cache.kept

    @property
    def loads(self) -> int:
        """Models loaded by this runtime so far (cache misses)."""
        return self.cache.stats.loads

    # ---- what tasks call -------------------------------------------------------------------------------

    def model(self, repo_id: str, progress: Progress | None = None) -> nn.Module:
        """The cached model of `repo_id`, loading (and downloading) it on first use."""
        return self.cache.get(repo_id, progress=progress)

    def config(self, repo_id: str) -> Sapiens2Config:
        """The model's config: the loaded model's, else its config read alone (the weights are not loaded)."""
        if repo_id in self.cache:
            return self.model(repo_id).config
        if repo_id not in self._configs:
            self._configs[repo_id] = hub.load_model_config(repo_id)
        return self._configs[repo_id]

    def settings(self, repo_id: str, kind: ModelKind) -> ProcessorSettings:
        """The repo's preprocessing: its preprocessor_config.json when available, else the kind's defaults at
        the image size of the model's config (4096x3072 for the 4K backbone, else 1024x768); refused when the
        model cannot take inputs of that size."""
        if repo_id not in self._settings:
            config = self.config(repo_id)
            directory = hub.processor_config_dir(repo_id)
            if directory is None:
                settings = ProcessorSettings.for_kind(kind, config.image_size)
            else:
                settings = ProcessorSettings.from_pretrained_dir(directory, kind, config.image_size)
            if not config.accepts_input_size(settings.size):
                built, asked = size_text(config.image_size), size_text(settings.size)
                raise ConfigError(
                    f"{hub.display_name(repo_id)} was built for {built} inputs (image_size in its "
                    f"config.json) and cannot run at the {asked} that its preprocessor_config.json asks for. "
                    "Make the two sizes agree."
                )
            self._settings[repo_id] = settings
        return self._settings[repo_id]

    def run_on_device(self, context: PipelineContext, photos: Sequence[Photo], first_step: int) -> None:
        """The pipeline's steps from `first_step` on, through the one device runner (`run_device_work`): here,
        or across the device boundary when one is set, as plain data (the photos already resized for the
        model on this side)."""
        task, options = context.task.name, dict(context.options)
        work = DeviceWork(task, context.repo_id, options, first_step, list(photos), context.progress)
        if self.device_boundary is None:
            # The whole model side: detection, forwards and decoding may each meet an operation MPS lacks.
            with recording_cpu_fallbacks(self.device, self.cpu_fallbacks):
                outcome = run_device_work(self, work, portable=False)
        else:
            for photo in photos:
                photo.image.model_rgb  # noqa: B018 - resized here, on the CPU, before the photo crosses
            outcome = self.device_boundary(work)
        outcome.applied_to(photos, context)

    def prepare(self, repo_id: str, progress: Progress | None = None) -> None:
        """Make `repo_id` ready before a long job, so a missing or broken checkpoint fails first: loaded
        here, or, when the models live across a device boundary, its config read (the device loads it)."""
        if self.device_boundary is None:
            self.model(repo_id, progress)
        else:
            self.config(repo_id)

    def preload(self, repo_id: str) -> None:
        """Load `repo_id` now and keep it: the models a host loads at start-up (`resident`)."""
        self.model(repo_id)
        self.cache.keep(repo_id)

    def use_device(self, device: torch.device) -> None:
        """Run on `device` from now on: a forked worker that really holds the device its parent emulated."""
        self.device = device
        self.cache.device = device
        if self._builds_detector:
            self._detector = None  # built again, on the new device, at the next detection

    def detect(self, image: LoadedImage) -> Detections:
        """Person boxes in the photo's model-side pixels."""
        with self._detector_lock:
            if self._detector is None:
                self._detector = YoloPersonDetector(self._detector_source, device=str(self.device))
            detector = self._detector
        return detector.detect(image.model_rgb)

    def forward(self, model: nn.Module, pixel_values: torch.Tensor, **kwargs: Any) -> Any:
        """The model's output dataclass for a batch of inputs, run in chunks of `batch_size`; its tensor
        fields are float32 and hold the whole batch."""
        chunks = []
        with torch.inference_mode():
            for start in range(0, len(pixel_values), self.batch_size):
                check_cancelled()  # a cancelled request stops here, between batches
                batch = pixel_values[start : start + self.batch_size].to(self.device, self.dtype)
                chunks.append(model(batch, **kwargs))
            synchronize(self.device)
        return _concatenated(chunks)

    # ---- what the app and the command line call ------------------------------------------------------

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
            self,
            entry,
            model or entry.repo_id(size),
            entry.coerce_options(options, self.device),
            progress,
            name=model_name if model else None,
        )
        results = entry.run(context, loaded, given, self.run_on_device)
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
        """Every picture task on one photo, sharing the cached models (the body-part model among them)."""
        loaded = image if isinstance(image, LoadedImage) else load_image(image)
        results = []
        for index, name in enumerate(ALL_TASKS):
            check_cancelled()
            task = TASKS[name]
            count = len(ALL_TASKS)
            step = within(progress, index / count, (index + 1) / count, f"{task.title}: ")
            results.append(self.run(name, loaded, size=task.size_or_default(size), progress=step))
        return results

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


def _concatenated(chunks: Sequence[Any]) -> Any:
    """One output dataclass from the outputs of consecutive chunks: tensor fields joined and made float32."""
    first = chunks[0]
    joined = {}
    for field in dataclasses.fields(first):
        values = [getattr(chunk, field.name) for chunk in chunks]
        if isinstance(values[0], torch.Tensor):
            joined[field.name] = torch.cat([value.float() for value in values])
        else:
            joined[field.name] = values[0]
    return type(first)(**joined)
