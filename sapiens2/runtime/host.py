"""The model host: one device and precision, the model cache, the person detector and batched forwards; what
pipelines ask for (`sapiens2.pipelines.context.ModelHost`) and what runs a batch's device work."""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from sapiens2.errors import ConfigError
from sapiens2.models import hub
from sapiens2.models.config import Sapiens2Config
from sapiens2.models.device import (
    MPS_WITHOUT_FALLBACK,
    choose_dtype,
    dtype_name,
    mps_fallback_active,
    recording_cpu_fallbacks,
    resolve_device,
    synchronize,
)
from sapiens2.models.kinds import ModelKind
from sapiens2.progress import Progress
from sapiens2.runtime.boundary import DeviceOutcome, DeviceWork, run_device_work
from sapiens2.runtime.cache import ModelCache, budget_from_env
from sapiens2.runtime.jobs import check_cancelled
from sapiens2.runtime.onnx_backend import BACKENDS, ONNXRUNTIME, TORCH, load_onnxruntime, missing_onnxruntime
from sapiens2.settings import Settings, current
from sapiens2.tasks.registry import model_bytes_estimate
from sapiens2.vision.detector import Detections, PersonDetector, YoloPersonDetector
from sapiens2.vision.images import LoadedImage
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


class Host:
    """Where the models live: a device and precision, cached models with their configs and preprocessing,
    the person detector, forwards in chunks of `batch_size`; it runs device work (`run_work`)."""

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
        """Models loaded by this host so far (cache misses)."""
        return self.cache.stats.loads

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

    def run_work(self, work: DeviceWork, portable: bool = False) -> DeviceOutcome:
        """The work's model steps on this host's models, through the one device runner (`run_device_work`);
        `portable`: its outcome made to cross a process. Detection, forwards and decoding may each meet an
        operation MPS lacks: those are recorded in `cpu_fallbacks`."""
        with recording_cpu_fallbacks(self.device, self.cpu_fallbacks):
            return run_device_work(self, work, portable)


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
