"""Reading safetensors weights: each file's header checked against its size and against the model, then every
tensor read straight into the requested dtype and device."""

from __future__ import annotations

import json
import math
import os
import queue
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

import torch

from sapiens2.errors import CheckpointError
from sapiens2.progress import Progress

# Original checkpoints store the RoPE periods the model was trained with; transformers' files lack them, and
# the model computes them from its config then.
OPTIONAL_SUFFIXES = ("rope_embed.periods",)
MAX_HEADER_BYTES = 100 * 1024 * 1024
LISTED_NAMES = 5
# Threads that read and convert tensors: reads and casts release the GIL, so a few overlap well.
LOAD_THREADS = min(4, os.cpu_count() or 1)


_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2, "I64": torch.int64, "I32": torch.int32,
    "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool,
}  # fmt: skip


@dataclass(frozen=True)
class _Entry:
    """Where one tensor lies in a safetensors file."""

    path: Path
    dtype: torch.dtype
    shape: tuple[int, ...]
    start: int
    nbytes: int


def _read_header(path: Path) -> dict[str, _Entry]:
    """Validate a safetensors file's header against its size and return where each tensor lies."""
    size = path.stat().st_size
    with path.open("rb") as file:
        prefix = file.read(8)
        length = int.from_bytes(prefix, "little") if len(prefix) == 8 else -1
        if not 0 < length <= min(size - 8, MAX_HEADER_BYTES):
            raise CheckpointError(f"{path}: not a safetensors file, or its header is cut short")
        raw = file.read(length)
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CheckpointError(f"{path}: corrupt safetensors header ({error})") from error
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: corrupt safetensors header (not a JSON object)")
    data_start = 8 + length
    entries: dict[str, _Entry] = {}
    for name, info in header.items():
        if name != "__metadata__":
            entries[name] = _entry(path, name, info, data_start)
    described = max((entry.start + entry.nbytes for entry in entries.values()), default=data_start)
    if described != size:
        raise CheckpointError(
            f"{path}: truncated or corrupt: the header describes {described - data_start} bytes of "
            f"tensor data, the file holds {size - data_start}"
        )
    return entries


def _entry(path: Path, name: str, info: object, data_start: int) -> _Entry:
    try:
        if not isinstance(info, dict):
            raise TypeError("not an object")
        dtype = _DTYPES[info["dtype"]]
        shape = tuple(int(d) for d in info["shape"])
        begin, end = (int(offset) for offset in info["data_offsets"])
    except (KeyError, TypeError, ValueError) as error:
        raise CheckpointError(f"{path}: corrupt header entry for tensor {name}: {info!r}") from error
    nbytes = math.prod(shape) * dtype.itemsize
    if begin < 0 or end - begin != nbytes or min(shape, default=0) < 0:
        raise CheckpointError(f"{path}: tensor {name} claims bytes {begin}..{end} for shape {list(shape)}")
    return _Entry(path, dtype, shape, data_start + begin, nbytes)


def listed(names: Iterable[str]) -> str:
    """At most LISTED_NAMES of `names`, sorted, and how many more there are."""
    names = sorted(names)
    more = f" (and {len(names) - LISTED_NAMES} more)" if len(names) > LISTED_NAMES else ""
    return ", ".join(names[:LISTED_NAMES]) + more


def stored_float_dtype(weight_paths: Sequence[Path]) -> torch.dtype | None:
    """The dtype of the first floating-point tensor of the first weight file, read from its header; None when
    it holds none."""
    entries = _read_header(weight_paths[0]).values() if weight_paths else ()
    return next((entry.dtype for entry in entries if entry.dtype.is_floating_point), None)


def read_state_dict(
    weight_paths: Sequence[Path],
    expected: dict[str, torch.Tensor],
    device: torch.device,
    dtype: torch.dtype,
    *,
    label: str,
    progress: Progress | None = None,
    progress_name: str | None = None,
) -> dict[str, torch.Tensor]:
    """Every tensor of `expected` (a model's state dict on the meta device) read from the weight files into
    `dtype` (floating tensors only) on `device`, but those named by OPTIONAL_SUFFIXES that the files lack;
    any other mismatch with the model is one CheckpointError naming `label`. `progress(fraction, text)`
    follows the reading, naming `progress_name` (default: `label`)."""
    entries = _checked_entries(weight_paths, expected, label)
    return _materialize(entries, expected, device, dtype, progress, progress_name or label)


def _checked_entries(
    weight_paths: Sequence[Path], expected: dict[str, torch.Tensor], label: str
) -> dict[str, _Entry]:
    """Every tensor the model needs, located in the weight files; any mismatch is one CheckpointError."""
    entries: dict[str, _Entry] = {}
    for path in weight_paths:
        for name, entry in _read_header(path).items():
            if name in entries:
                message = f"{label}: tensor {name} is stored twice ({entries[name].path}, {path})"
                raise CheckpointError(message)
            entries[name] = entry
    missing = {n for n in expected.keys() - entries.keys() if not n.endswith(OPTIONAL_SUFFIXES)}
    unexpected = entries.keys() - expected.keys()
    wrong_shape = [
        f"{name} {list(entries[name].shape)} (model: {list(tensor.shape)})"
        for name, tensor in expected.items()
        if name in entries and entries[name].shape != tuple(tensor.shape)
    ]
    problems = []
    if missing:
        problems.append(f"{len(missing)} missing tensors: {listed(missing)}")
    if unexpected:
        problems.append(f"{len(unexpected)} unexpected tensors: {listed(unexpected)}")
    if wrong_shape:
        problems.append(f"{len(wrong_shape)} tensors with the wrong shape: {listed(wrong_shape)}")
    if problems:
        mismatch = "; ".join(problems)
        raise CheckpointError(f"{label} does not match the model of its config: {mismatch}")
    return {name: entries[name] for name in expected if name in entries}


def _materialize(
    entries: dict[str, _Entry],
    expected: dict[str, torch.Tensor],
    device: torch.device,
    dtype: torch.dtype,
    progress: Progress | None,
    label: str,
) -> dict[str, torch.Tensor]:
    """Read every tensor into `dtype` (floating tensors only) on `device`.

    Every tensor is read (never memory-mapped) into memory the process owns: a checkpoint file truncated or
    rewritten while the server runs can neither crash it (SIGBUS on a mapped page) nor change a loaded model.
    On the CPU a tensor already in the right dtype is read straight into its own memory; the others are read
    by a few threads, each through its own reusable (pinned, for CUDA) staging buffer, and converted: the
    peak is the result plus one tensor per thread, on the host and on the device.
    """
    targets = {name: dtype if t.dtype.is_floating_point else t.dtype for name, t in expected.items()}
    on_cpu = device.type == "cpu"
    staged = list(entries)
    total = sum(entry.nbytes for entry in entries.values()) or 1
    done = 0

    def report(name: str) -> None:
        nonlocal done
        before, done = done, done + entries[name].nbytes
        if progress and int(100 * done / total) != int(100 * before / total):
            progress(done / total, f"loading weights of {label}")

    state: dict[str, torch.Tensor] = {}
    if not staged:
        return state
    buffers: queue.SimpleQueue[torch.Tensor] = queue.SimpleQueue()
    workers = min(LOAD_THREADS, len(staged))
    size = max(entries[name].nbytes for name in staged)
    for _ in range(workers):
        buffers.put(torch.empty(size, dtype=torch.uint8, pin_memory=device.type == "cuda"))

    def convert(name: str) -> torch.Tensor:
        if on_cpu and entries[name].dtype == targets[name]:  # read straight into the tensor's own memory
            return _read_into(entries[name], torch.empty(entries[name].nbytes, dtype=torch.uint8))
        staging = buffers.get()
        try:
            tensor = _read_into(entries[name], staging)
            if on_cpu:
                return tensor.to(targets[name], copy=True)
            # Cast on the device: a cast inside a host-to-device copy runs on the host, via pageable memory.
            return tensor.to(device).to(targets[name])
        finally:
            buffers.put(staging)

    with ThreadPoolExecutor(workers) as pool:
        futures = {pool.submit(convert, name): name for name in staged}
        try:
            for future in as_completed(futures):
                state[futures[future]] = future.result()
                report(futures[future])
        except BaseException:
            pool.shutdown(cancel_futures=True)
            raise
    return state


def _read_into(entry: _Entry, staging: torch.Tensor) -> torch.Tensor:
    """The tensor at `entry`, read into the front of `staging` (valid until the buffer is reused)."""
    buffer = staging[: entry.nbytes]
    view = memoryview(buffer.numpy())
    filled = 0
    with entry.path.open("rb", buffering=0) as raw:
        raw.seek(entry.start)
        while filled < entry.nbytes:
            count = raw.readinto(view[filled:])
            if not count:
                raise CheckpointError(f"{entry.path}: file ended inside tensor data (changed on disk?)")
            filled += count
    return buffer.view(entry.dtype).view(entry.shape)
