"""Reading safetensors weights: each file's header checked against its size and against the model, every
tensor read in pieces straight into its final memory in the requested dtype and device, then each file's
identity checked again."""

from __future__ import annotations

import json
import math
import os
import queue
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from sapiens2.errors import CheckpointError
from sapiens2.models.fresh_memory import populate
from sapiens2.progress import Progress

# Original checkpoints store the RoPE periods the model was trained with; transformers' files lack them, and
# the model computes them from its config then.
OPTIONAL_SUFFIXES = ("rope_embed.periods",)
MAX_HEADER_BYTES = 100 * 1024 * 1024
LISTED_NAMES = 5
# Threads that read and convert tensors: reads and casts release the GIL, so a few overlap well.
LOAD_THREADS = min(4, os.cpu_count() or 1)
# Bytes one thread reads (and casts) at a time: large reads, and a staging buffer that stays small.
CHUNK_BYTES = 8 * 1024 * 1024


_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2, "I64": torch.int64, "I32": torch.int32,
    "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool,
}  # fmt: skip


@dataclass(frozen=True)
class _Entry:
    """Where one tensor lies in a safetensors file."""

    file: _WeightFile
    dtype: torch.dtype
    shape: tuple[int, ...]
    start: int
    nbytes: int

    @property
    def path(self) -> Path:
        return self.file.path


class _WeightFile:
    """A safetensors file held open while it is read: its header checked against its size at opening, its
    identity (device, inode, size, modification time) kept, so a file rewritten or replaced meanwhile is
    noticed (`check_unchanged`)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd = os.open(path, os.O_RDONLY | getattr(os, "O_BINARY", 0))
        try:
            self.identity = _identity(os.fstat(self.fd))
            self.entries = _read_header(self)
        except BaseException:
            os.close(self.fd)
            raise

    def read_into(self, view: memoryview, offset: int) -> None:
        """Fill `view` with the file's bytes from `offset` (positional reads: threads share the file)."""
        filled = 0
        while filled < len(view):
            count = os.preadv(self.fd, [view[filled:]], offset + filled)
            if not count:
                raise CheckpointError(f"{self.path}: file ended inside tensor data (changed on disk?)")
            filled += count

    def check_unchanged(self) -> None:
        """A CheckpointError when the file was rewritten, or its path given another file, since opening."""
        try:
            on_disk = _identity(os.stat(self.path))
        except OSError:
            on_disk = None
        if _identity(os.fstat(self.fd)) != self.identity or on_disk != self.identity:
            raise CheckpointError(
                f"{self.path}: the file changed on disk while it was read; load it again once it is complete"
            )

    def close(self) -> None:
        os.close(self.fd)


def _identity(status: os.stat_result) -> tuple[int, ...]:
    return status.st_dev, status.st_ino, status.st_size, status.st_mtime_ns


def _read_header(file: _WeightFile) -> dict[str, _Entry]:
    """Validate a safetensors file's header against its size and return where each tensor lies."""
    path, size = file.path, file.identity[2]
    prefix = os.pread(file.fd, 8, 0)
    length = int.from_bytes(prefix, "little") if len(prefix) == 8 else -1
    if not 0 < length <= min(size - 8, MAX_HEADER_BYTES):
        raise CheckpointError(f"{path}: not a safetensors file, or its header is cut short")
    raw = os.pread(file.fd, length, 8)
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
            entries[name] = _entry(file, name, info, data_start)
    described = max((entry.start + entry.nbytes for entry in entries.values()), default=data_start)
    if described != size:
        raise CheckpointError(
            f"{path}: truncated or corrupt: the header describes {described - data_start} bytes of "
            f"tensor data, the file holds {size - data_start}"
        )
    return entries


def _entry(file: _WeightFile, name: str, info: object, data_start: int) -> _Entry:
    try:
        if not isinstance(info, dict):
            raise TypeError("not an object")
        dtype = _DTYPES[info["dtype"]]
        shape = tuple(int(d) for d in info["shape"])
        begin, end = (int(offset) for offset in info["data_offsets"])
    except (KeyError, TypeError, ValueError) as error:
        raise CheckpointError(f"{file.path}: corrupt header entry for tensor {name}: {info!r}") from error
    nbytes = math.prod(shape) * dtype.itemsize
    if begin < 0 or end - begin != nbytes or min(shape, default=0) < 0:
        raise CheckpointError(
            f"{file.path}: tensor {name} claims bytes {begin}..{end} for shape {list(shape)}"
        )
    return _Entry(file, dtype, shape, data_start + begin, nbytes)


def listed(names: Iterable[str]) -> str:
    """At most LISTED_NAMES of `names`, sorted, and how many more there are."""
    names = sorted(names)
    more = f" (and {len(names) - LISTED_NAMES} more)" if len(names) > LISTED_NAMES else ""
    return ", ".join(names[:LISTED_NAMES]) + more


def stored_float_dtype(weight_paths: Sequence[Path]) -> torch.dtype | None:
    """The dtype of the first floating-point tensor of the first weight file, read from its header; None when
    it holds none."""
    if not weight_paths:
        return None
    with _opened(weight_paths[:1]) as (file,):
        return next((entry.dtype for entry in file.entries.values() if entry.dtype.is_floating_point), None)


@contextmanager
def _opened(weight_paths: Sequence[Path]) -> Iterator[list[_WeightFile]]:
    """The weight files, open (and each header checked) while the block runs."""
    files: list[_WeightFile] = []
    try:
        for path in weight_paths:
            files.append(_WeightFile(path))
        yield files
    finally:
        for file in files:
            file.close()


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
    any other mismatch with the model, or a file changed while it was read, is one CheckpointError naming
    `label` or the file. `progress(fraction, text)` follows the reading, naming `progress_name` (default:
    `label`). Tensors that are views of one storage in `expected` (the fused q, k and v projections) are
    read into one storage laid out the same way."""
    with _opened(weight_paths) as files:
        entries = _checked_entries(files, expected, label)
        state = _materialize(entries, expected, device, dtype, progress, progress_name or label)
        for file in files:
            file.check_unchanged()
    return state


def _checked_entries(
    files: Sequence[_WeightFile], expected: dict[str, torch.Tensor], label: str
) -> dict[str, _Entry]:
    """Every tensor the model needs, located in the weight files; any mismatch is one CheckpointError."""
    entries: dict[str, _Entry] = {}
    for file in files:
        for name, entry in file.entries.items():
            if name in entries:
                message = f"{label}: tensor {name} is stored twice ({entries[name].path}, {file.path})"
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


def _allocate(
    entries: dict[str, _Entry],
    expected: dict[str, torch.Tensor],
    targets: dict[str, torch.dtype],
    device: torch.device,
) -> dict[str, torch.Tensor]:
    """Uninitialized memory for every tensor to read. Tensors sharing one storage in `expected`, which they
    tile exactly, in one dtype and each contiguous, get views of one new storage at the same offsets."""
    groups: dict[int, list[str]] = {}
    for name in entries:
        groups.setdefault(expected[name].untyped_storage()._cdata, []).append(name)
    memory: dict[str, torch.Tensor] = {}
    for names in groups.values():
        layout = sorted(names, key=lambda name: expected[name].storage_offset())
        first = expected[layout[0]]
        end = 0
        for name in layout:
            tensor = expected[name]
            if (
                tensor.storage_offset() != end
                or not tensor.is_contiguous()
                or targets[name] != targets[layout[0]]
            ):
                break
            end += tensor.numel()
        if len(layout) > 1 and end * first.element_size() == first.untyped_storage().nbytes():
            storage = torch.empty(end, dtype=targets[layout[0]], device=device)
            for name in layout:
                tensor = expected[name]
                offset = tensor.storage_offset()
                memory[name] = storage[offset : offset + tensor.numel()].view(tensor.shape)
        else:
            memory.update({n: torch.empty(expected[n].shape, dtype=targets[n], device=device) for n in names})
    return memory


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
    Each tensor is read in pieces of at most CHUNK_BYTES by a few threads (positional reads, which release
    the GIL): on the CPU a piece already in the right dtype goes straight into the tensor's final memory, the
    others through the thread's reusable (pinned, for CUDA) staging buffer and are cast into it. The peak
    is the result plus one piece per thread, on the host and on the device.
    """
    targets = {name: dtype if t.dtype.is_floating_point else t.dtype for name, t in expected.items()}
    memory = _allocate(entries, expected, targets, device)
    pieces = [
        (name, first, min(entry.nbytes, first + _piece_bytes(entry)))
        for name, entry in entries.items()
        for first in range(0, entry.nbytes, _piece_bytes(entry))
    ]
    if not pieces:
        return memory
    on_cpu = device.type == "cpu"
    buffers: queue.SimpleQueue[torch.Tensor] = queue.SimpleQueue()
    workers = min(LOAD_THREADS, len(pieces))
    size = max(stop - first for _, first, stop in pieces)
    for _ in range(workers):
        buffers.put(torch.empty(size, dtype=torch.uint8, pin_memory=device.type == "cuda"))

    def read(name: str, first: int, stop: int) -> None:
        entry, itemsize = entries[name], entries[name].dtype.itemsize
        target = memory[name].view(-1)[first // itemsize : stop // itemsize]
        if on_cpu:
            populate(target)
        if on_cpu and entry.dtype == target.dtype:  # straight into the tensor's own memory
            entry.file.read_into(memoryview(target.view(torch.uint8).numpy()), entry.start + first)
            return
        staging = buffers.get()
        try:
            piece = staging[: stop - first]
            entry.file.read_into(memoryview(piece.numpy()), entry.start + first)
            piece = piece.view(entry.dtype)
            # On CUDA the cast runs on the device: a cast inside a host-to-device copy runs on the host.
            target.copy_(piece if on_cpu or entry.dtype == target.dtype else piece.to(device))
        finally:
            buffers.put(staging)

    total = sum(stop - first for _, first, stop in pieces)
    done = 0
    with ThreadPoolExecutor(workers) as pool:
        futures = {pool.submit(read, *piece): piece for piece in pieces}
        try:
            for future in as_completed(futures):
                future.result()
                _, first, stop = futures[future]
                before, done = done, done + stop - first
                if progress and int(100 * done / total) != int(100 * before / total):
                    progress(done / total, f"loading weights of {label}")
        except BaseException:
            pool.shutdown(cancel_futures=True)
            raise
    return memory


def _piece_bytes(entry: _Entry) -> int:
    """Bytes of `entry` read (and cast) at a time: CHUNK_BYTES, in whole elements."""
    return max(1, CHUNK_BYTES // entry.dtype.itemsize) * entry.dtype.itemsize
