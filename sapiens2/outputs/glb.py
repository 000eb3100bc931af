"""Binary glTF's container: a JSON chunk and a binary chunk, written (and the JSON read back), and a builder
of the binary buffer's views and accessors from numpy arrays."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import BinaryIO

import numpy as np

GLB_MAGIC, GLB_VERSION, JSON_CHUNK, BIN_CHUNK = 0x46546C67, 2, 0x4E4F534A, 0x004E4942
ARRAY_BUFFER, ELEMENT_ARRAY_BUFFER = 34962, 34963
FLOAT, UNSIGNED_SHORT, UNSIGNED_INT = 5126, 5123, 5125
_TYPES = {1: "SCALAR", 2: "VEC2", 3: "VEC3", 4: "VEC4", 16: "MAT4"}
_COMPONENTS = {np.dtype("<f4"): FLOAT, np.dtype("<u2"): UNSIGNED_SHORT, np.dtype("<u4"): UNSIGNED_INT}


def write_container(file: BinaryIO, document: dict, parts: list[np.ndarray | bytes]) -> None:
    """A GLB of `document` whose one buffer is `parts` one after the other (each a multiple of 4 bytes)."""
    text = json.dumps(document, separators=(",", ":"), allow_nan=False).encode("utf-8")
    text += b" " * (-len(text) % 4)  # chunks are 4-byte aligned; JSON is padded with spaces
    binary = sum(len(memoryview(part).cast("B")) for part in parts)
    total = 12 + 8 + len(text) + (8 + binary if parts else 0)
    if total >= 2**32:
        raise ValueError(f"a GLB holds at most 4 GB; this one would take {total / 1e9:.1f} GB")
    file.write(struct.pack("<III", GLB_MAGIC, GLB_VERSION, total))
    file.write(struct.pack("<II", len(text), JSON_CHUNK) + text)
    if parts:
        file.write(struct.pack("<II", binary, BIN_CHUNK))
        for part in parts:
            file.write(memoryview(part).cast("B"))


def read_document(path: Path) -> dict | None:
    """The JSON document of a GLB file (its first chunk); None for a file that is not one."""
    try:
        with path.open("rb") as file:
            magic, _, _ = struct.unpack("<III", file.read(12))
            length, kind = struct.unpack("<II", file.read(8))
            if magic != GLB_MAGIC or kind != JSON_CHUNK:
                return None
            return json.loads(file.read(length))
    except (OSError, struct.error, ValueError):
        return None


class BufferBuilder:
    """The buffer, buffer views and accessors of a glTF document, filled array by array."""

    def __init__(self) -> None:
        self.parts: list[np.ndarray | bytes] = []
        self.views: list[dict] = []
        self.accessors: list[dict] = []
        self._length = 0

    def view(self, data: np.ndarray | bytes, target: int | None = None) -> int:
        """A buffer view of `data` (padded to 4 bytes); returns its index."""
        raw = data.tobytes() if isinstance(data, np.ndarray) else bytes(data)
        raw += b"\0" * (-len(raw) % 4)
        view = {"buffer": 0, "byteOffset": self._length, "byteLength": len(raw)}
        if target is not None:
            view["target"] = target
        self.parts.append(raw)
        self._length += len(raw)
        self.views.append(view)
        return len(self.views) - 1

    def accessor(self, array: np.ndarray, target: int | None = None, bounds: bool = False, **extra) -> int:
        """An accessor of `array` (count, components) or (count,): float32, uint16 or uint32; `bounds` adds
        min and max (required for positions and animation times); returns its index."""
        array = np.ascontiguousarray(array)
        array = array.astype(array.dtype.newbyteorder("<"))
        count = len(array)
        components = int(np.prod(array.shape[1:])) if array.ndim > 1 else 1
        accessor = {
            "bufferView": self.view(array, target),
            "componentType": _COMPONENTS[array.dtype],
            "count": count,
            "type": _TYPES[components],
            **extra,
        }
        if bounds:
            flat = array.reshape(count, components).astype(np.float64)
            accessor["min"], accessor["max"] = flat.min(axis=0).tolist(), flat.max(axis=0).tolist()
        self.accessors.append(accessor)
        return len(self.accessors) - 1

    def into(self, document: dict) -> list[np.ndarray | bytes]:
        """Adds the buffer, its views and accessors to `document`; returns the parts to write."""
        if self.parts:
            document |= {
                "buffers": [{"byteLength": self._length}],
                "bufferViews": self.views,
                "accessors": self.accessors,
            }
        return self.parts
