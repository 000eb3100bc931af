"""Hosting on a Hugging Face ZeroGPU Space: the one module that knows the `spaces` package.

On ZeroGPU the web process has no GPU. `spaces` emulates CUDA in it, and each call of a function decorated
with `spaces.GPU` runs in a worker process forked from it that holds a real GPU for the call, its arguments
and result pickled through a queue; the worker is reused while the GPU stays idle. So here:

- the runtime's model host is module state that the worker inherits by the fork, never an argument
  (`serve`); the runner stays in the web process;
- the default model of every tab, and the helpers they use, is loaded at start-up on the CPU and moved to
  "cuda": spaces records those tensors, packs them once at launch and moves them to the GPU when a worker
  starts; other sizes load inside the call that needs them (the page says so);
- the one decorated entry point is the device boundary (`sapiens2.runtime.boundary`): plain `DeviceWork` in,
  `DeviceOutcome` out, with every error returned as data, so no worker dies of a bad photo;
- each call asks for a duration computed from its work (`duration_for`), not a fixed one;
- cancelling crosses by a flag in memory shared by the fork (`CANCEL_FLAGS`);
- ahead of time, in one long GPU call at start-up, the start-up models' repeated transformer blocks are
  captured (`spaces.aoti_capture`), exported and compiled (`spaces.aoti_compile`), once per block layout
  (`sapiens2.models.aot`); every block then runs its compiled program on its own weights in every later call.
  `spaces.aoti_apply` is not used: it drains the module's weights, and the blocks keep theirs to run eager
  for an input the program was not compiled for and after any failure (said in one log line).

Anywhere else (no `spaces` package, or `SPACES_ZERO_GPU` unset) `serve` changes nothing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

try:  # Imported before any model touches CUDA: on ZeroGPU, spaces patches torch when it is imported.
    import spaces
    from spaces.config import Config as _SpacesConfig
except ImportError:  # not a Space: nothing to adapt to
    spaces = None
    _SpacesConfig = None

import torch
from torch import nn

from sapiens2.models import aot
from sapiens2.runtime import Host, Runtime
from sapiens2.runtime.boundary import CANCEL_FLAGS, DeviceOutcome, DeviceWork
from sapiens2.runtime.jobs import current_job
from sapiens2.tasks import TASKS
from sapiens2.tasks.registry import model_bytes_estimate, official_checkpoint, parameter_count

log = logging.getLogger("sapiens2.zerogpu")

# What a call's duration is made of, in seconds. Estimates until this Space has measured its own per-photo
# time (the first call of each model replaces them): a worker's start (fork, spaces' init, the packed
# models moved to the GPU) is a few seconds; a model that is not kept loaded is read from disk at about
# 1 GB/s; a forward at 1024x768 is 2 x parameters x 3072 tokens of bf16 work, at 100 TFLOP/s (a quarter
# of what the H200 slice a ZeroGPU call gets can do); pose runs one crop per person (4 counted).
WORKER_START_SECONDS = 10.0
LOAD_BYTES_PER_SECOND = 1e9
FLOPS_PER_SECOND = 1e14
TOKENS = 3072
CROPS_PER_PHOTO = {"pose": 4}
PHOTO_SECONDS_FLOOR = 0.05  # detection, pre- and post-processing on the device
MARGIN = 2.0  # the estimate doubled: ZeroGPU may stop a call that runs past what it asked for
SHORTEST, LONGEST = 15, 120  # seconds; ZeroGPU refuses longer asks from most visitors
# The start-up call that compiles: a Space's own start-up may ask for long calls (Hugging Face's example of
# ahead-of-time compilation asks for 1500 s); a compile of one block layout takes about a minute on the GPU.
AOT_SECONDS = 1500

LIVE_UNAVAILABLE = (
    "The live webcam is off on this Space: ZeroGPU lends its GPU one call at a time, and a call per frame "
    "would spend a visitor's daily GPU time in seconds while showing a frame or two per second. The photo "
    "tabs and Video run normally; the webcam runs on a Space with a dedicated GPU or on your own machine."
)


@dataclass(frozen=True)
class Hosting:
    """How this server is hosted, as the app needs to know it."""

    name: str = "a server of its own"
    live_unavailable: str | None = None  # why the live webcam is off, when it is
    resident: tuple[str, ...] = ()  # models loaded at start-up and kept
    startup_seconds: float = 0.0


def on_zerogpu() -> bool:
    """Whether this process runs on a ZeroGPU Space (spaces installed and SPACES_ZERO_GPU set)."""
    return _SpacesConfig is not None and bool(_SpacesConfig.zero_gpu)


def serve(runtime: Runtime) -> Hosting:
    """Adapt `runtime` to where it is hosted; on ZeroGPU, load the default models and route every model
    step through the one GPU entry point. Call it before the app is launched."""
    if not on_zerogpu():
        return Hosting()
    global _runtime, _on_gpu
    _runtime = runtime.host
    runtime.cache.load_through(cpu_staged)
    start = time.perf_counter()
    for repo_id in default_models():
        runtime.preload(repo_id)
    seconds = time.perf_counter() - start
    log.info(
        "ZeroGPU: %d models loaded at start-up in %.1f s (%.2f GB at %s): %s",
        len(runtime.resident),
        seconds,
        runtime.cache.bytes_held / 1e9,
        runtime.dtype_label,
        ", ".join(sorted(runtime.resident)),
    )
    _on_gpu = spaces.GPU(duration=duration_for)(_in_worker)
    runtime.device_boundary = _through_worker
    if runtime.setup.zerogpu_aot:
        compile_ahead(runtime.host)
    seconds = time.perf_counter() - start
    return Hosting("ZeroGPU", LIVE_UNAVAILABLE, tuple(sorted(runtime.resident)), seconds)


def compile_ahead(host: Host) -> int:
    """Compile the start-up models' repeated blocks in one long GPU call and apply them; the number of blocks
    that run compiled (none, after one log line, when anything fails: the models run eager)."""
    models = {repo_id: host.model(repo_id) for repo_id in sorted(host.resident)}
    models = {repo_id: model for repo_id, model in models.items() if aot.backbones(model)}
    start = time.perf_counter()
    on_gpu = spaces.GPU(duration=AOT_SECONDS)(_compile_in_worker)
    blocks = aot.compiled_or_eager(models.values(), lambda: on_gpu(list(models)), _load_in_worker, _fallback)
    if blocks:
        log.info(
            "ZeroGPU: %d blocks of %d models compiled ahead of time in %.1f s",
            len(blocks),
            len(models),
            time.perf_counter() - start,
        )
    return len(blocks)


def default_models() -> list[str]:
    """The default checkpoint of every task and the helpers they use, each once."""
    repo_ids = (repo_id for task in TASKS.values() for repo_id in task.repo_ids_needed(task.default_size))
    return list(dict.fromkeys(repo_ids))


# ---- the web process's side --------------------------------------------------------------------------------

_runtime: Host | None = None  # the model host, inherited by every GPU worker
_on_gpu: Any = None


@dataclass
class _Measured:
    """Device seconds per photo measured on this Space, per checkpoint (the latest call's)."""

    seconds: dict[str, float] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)


_measured = _Measured()


def _through_worker(work: DeviceWork) -> DeviceOutcome:
    """The device boundary on ZeroGPU: the work sent to a GPU worker with a shared cancellation flag."""
    with CANCEL_FLAGS.watching(current_job()) as ticket:
        outcome = _on_gpu(dataclasses.replace(work, ticket=ticket))
    if outcome.error is None and outcome.loads == 0 and work.count:
        with _measured.lock:
            _measured.seconds[work.repo_id] = outcome.seconds / work.count
    return outcome


def duration_for(work: DeviceWork) -> int:
    """The GPU seconds to ask ZeroGPU for this work: a worker's start, any model to load, and the photos'
    forwards, doubled, within [SHORTEST, LONGEST]."""
    seconds = WORKER_START_SECONDS + work.count * _photo_seconds(work.task, work.repo_id)
    host = _runtime
    needed = {work.repo_id, *([TASKS[work.task].helper_repo_id(work.repo_id)] if work.task in TASKS else [])}
    for repo_id in needed - {None} - (host.resident if host is not None else set()):
        size = model_bytes_estimate(repo_id, host.dtype if host is not None else torch.bfloat16)
        seconds += (size or 4e9) / LOAD_BYTES_PER_SECOND
    return int(min(LONGEST, max(SHORTEST, MARGIN * seconds)))


def _photo_seconds(task: str, repo_id: str) -> float:
    with _measured.lock:
        if repo_id in _measured.seconds:
            return _measured.seconds[repo_id]
    official = official_checkpoint(repo_id)
    parameters = parameter_count(*official) if official is not None else 1e9
    forwards = CROPS_PER_PHOTO.get(task, 1)
    return PHOTO_SECONDS_FLOOR + forwards * 2 * parameters * TOKENS / FLOPS_PER_SECOND


# ---- the worker's side -------------------------------------------------------------------------------------


def _in_worker(work: DeviceWork) -> DeviceOutcome:
    """Run in the forked GPU worker, by the host it inherited, on the device it really holds (spaces has
    moved the start-up models there before the first call)."""
    host = _runtime
    assert host is not None, "serve() sets the host before the app starts"
    _use_the_real_device(host)
    return host.run_work(work, portable=True)


def _use_the_real_device(host: Host) -> None:
    real = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if host.device != real:
        host.use_device(real)


_fallback = aot.Fallback()


def _compile_in_worker(repo_ids: list[str]) -> dict[tuple, bytes]:
    """Run in a GPU worker: each distinct block layout of the models, compiled by spaces' helpers; the
    packages alone come back (each block brings its own weights where it runs)."""
    host = _runtime
    assert host is not None, "serve() sets the host before the app starts"
    _use_the_real_device(host)
    models = [host.model(repo_id) for repo_id in repo_ids]
    sizes = [tuple(model.config.image_size) for model in models]
    compiler = aot.Compiler(spaces.aoti_capture, _compile_with_spaces, _load_in_worker)
    return aot.compile_models(models, sizes, compiler)


def _compile_with_spaces(exported: torch.export.ExportedProgram) -> bytes:
    return spaces.aoti_compile(exported).archive_file.getvalue()


def _load_in_worker(archive: bytes, weights: dict[str, torch.Tensor]) -> Any:
    """A compiled block loaded in this worker once, with spaces removing its unpacked files when the worker
    ends (ZeroGPU ends workers without letting torch clean up)."""
    from spaces.zero.torch import aoti as spaces_aoti

    return aot.load_package(
        archive, weights, getattr(spaces_aoti, "_register_aoti_cleanup", contextlib.nullcontext)
    )


def cpu_staged(loader: Any) -> Any:
    """`loader` reading weights on the CPU, then the model moved to its device: under spaces' emulated CUDA
    a model is recorded for packing only when it is moved with `.to("cuda")`."""

    def load(repo_id: str, *, device: torch.device, **kwargs: Any) -> nn.Module:
        return loader(repo_id, device="cpu", **kwargs).to(device)

    return load
