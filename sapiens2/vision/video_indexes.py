"""The indexes a Matroska/WebM or AVI file makes FFmpeg build, counted from element and chunk headers.

FFmpeg keeps an index entry per cue point, seek entry, block or AVI index entry it is told of, and reads an
index wherever the file says it is. Before FFmpeg opens such a file, every index element (Matroska's
SeekHead and Cues, found in order or through the SeekHead; AVI's idx1, indx and ix## chunks) must lie
inside the file, hold the entries it claims, and claim no more entries than the limit; the blocks of
Matroska clusters and the chunks of an AVI's movi list (one sample each) are counted against it too. Only
headers are read, through a memory map of the file, and the walk stops as soon as the limit is passed.
"""

from __future__ import annotations

import mmap
import struct
from typing import IO

# Matroska element IDs (with their length marker, as written).
_SEGMENT, _CLUSTER, _CUES, _SEEK_HEAD = 0x18538067, 0x1F43B675, 0x1C53BB6B, 0x114D9B74
_CUE_POINT, _SEEK, _SEEK_ID, _SEEK_POSITION = 0xBB, 0x4DBB, 0x53AB, 0x53AC
_SIMPLE_BLOCK, _BLOCK_GROUP = 0xA3, 0xA0
# The top-level elements of a segment: an element of unknown size (a live recording's cluster) ends where
# one of these starts.
_TOP_LEVEL = frozenset(
    {_SEEK_HEAD, 0x1549A966, 0x1654AE6B, _CLUSTER, _CUES, 0x1941A469, 0x1043A770, 0x1254C367}
)
_NAMES = {_CUES: "Cues", _SEEK_HEAD: "SeekHead"}
_AVI_INDEX_OF_INDEXES = 0


class _Found(Exception):
    """What is wrong, as the end of a sentence; ends the walk."""


def matroska_index_problem(file: IO[bytes], limit: int) -> str | None:
    """What is wrong with a Matroska/WebM file's indexes and blocks (the end of a sentence), or None."""
    return _walk_problem(file, _MatroskaWalk, limit)


def avi_index_problem(file: IO[bytes], limit: int) -> str | None:
    """What is wrong with an AVI file's index chunks and sample count (the end of a sentence), or None."""
    return _walk_problem(file, _AviWalk, limit)


def _walk_problem(file: IO[bytes], walk: type, limit: int) -> str | None:
    """What the walk of the file's mapped bytes found wrong, or None."""
    with _mapped(file) as data:
        try:
            walk(data, limit).run()
        except _Found as found:
            return str(found)
    return None


class _mapped:
    """The file's bytes as a read-only memory map (an empty bytes object for an empty file)."""

    def __init__(self, file: IO[bytes]) -> None:
        size = file.seek(0, 2)
        self.data = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) if size else b""

    def __enter__(self) -> bytes:
        return self.data

    def __exit__(self, *exc_info: object) -> None:
        if isinstance(self.data, mmap.mmap):
            self.data.close()


def _vint(data: bytes, position: int, keep_marker: bool) -> tuple[int | None, int]:
    """An EBML variable-length number at `position` and its length; None as the value when unknown (all
    ones) or unreadable."""
    if position >= len(data) or data[position] == 0:
        return None, 1
    length = 9 - data[position].bit_length()
    raw = int.from_bytes(data[position : position + length], "big")
    if keep_marker:
        return raw, length
    value = raw & ((1 << (7 * length)) - 1)
    return (None if value == (1 << (7 * length)) - 1 else value), length


def _too_many(what: str, count: int, limit: int, *, counted_all: bool = True) -> _Found:
    """The sentence's end for `count` entries above `limit`; a walk that stopped early counted only
    `limit + 1` of them."""
    claimed = str(count) if counted_all else f"more than {limit}"
    return _Found(f"it claims {claimed} {what}, above this server's limit of {limit}")


class _MatroskaWalk:
    def __init__(self, data: bytes, limit: int) -> None:
        self.data, self.size, self.limit = data, len(data), limit
        self.blocks = 0
        self.checked: set[int] = set()

    def header(self, position: int) -> tuple[int | None, int, int | None]:
        """(element ID, where its body starts, its size or None when unknown)."""
        element, id_length = _vint(self.data, position, keep_marker=True)
        size, size_length = _vint(self.data, position + id_length, keep_marker=False)
        return element, position + id_length + size_length, size

    def run(self) -> None:
        position = 0
        while position + 2 <= self.size:
            element, body, size = self.header(position)
            if element is None:
                return
            if element == _SEGMENT:
                self.segment(body, self.size if size is None else min(body + size, self.size))
                return
            if size is None:
                return
            position = body + size

    def segment(self, start: int, end: int) -> None:
        position = start
        while position + 2 <= end:
            element, body, size = self.header(position)
            if element is None:
                return
            if element in _NAMES:
                self.index(position, start)
            if element == _CLUSTER:
                position = self.cluster(body, end if size is None else min(body + size, end))
            elif size is None:
                return  # only a cluster may leave its size open: FFmpeg decides about the rest
            else:
                position = body + size

    def index(self, position: int, segment: int) -> None:
        """Check a SeekHead or Cues element at `position` once: inside the file, entries within the limit;
        a SeekHead's targets are checked in turn."""
        if position in self.checked:
            return
        self.checked.add(position)
        element, body, size = self.header(position)
        name = _NAMES[element]
        if size is None or body + size > self.size:
            claimed = "an open size" if size is None else f"{size} bytes"
            raise _Found(
                f"its {name} index claims {claimed}, beyond the end of the file (the file is damaged or made "
                "to exhaust memory)"
            )
        entry = _CUE_POINT if element == _CUES else _SEEK
        entries, targets = 0, []
        for child, child_body, child_size in self.children(body, body + size):
            entries += child == entry
            if entries > self.limit:
                raise _too_many(f"{name} entries", entries, self.limit, counted_all=False)
            if child == _SEEK:
                targets += self.seek_targets(child_body, child_body + child_size, segment)
        for target in targets:
            self.index(target, segment)

    def seek_targets(self, start: int, end: int, segment: int) -> list[int]:
        """Where a Seek entry points, when it points at a SeekHead or Cues element."""
        sought, offset = None, None
        for child, body, size in self.children(start, end):
            value = int.from_bytes(self.data[body : body + size], "big")
            if child == _SEEK_ID:
                sought = value
            elif child == _SEEK_POSITION:
                offset = value
        if sought not in _NAMES or offset is None:
            return []
        target = segment + offset
        if target + 2 > self.size:
            raise _Found(
                f"its SeekHead points at a {_NAMES[sought]} index beyond the end of the file (the file is "
                "damaged)"
            )
        element, _, _ = self.header(target)
        return [target] if element == sought else []

    def children(self, start: int, end: int):
        """(ID, body, size) of each element of known size between `start` and `end`."""
        position = start
        while position + 2 <= end:
            element, body, size = self.header(position)
            if element is None or size is None or body + size > end:
                return
            yield element, body, size
            position = body + size

    def cluster(self, start: int, end: int) -> int:
        """Count a cluster's blocks; returns where the cluster ends (an open-sized one: at the next
        top-level element)."""
        position = start
        while position + 2 <= end:
            element, body, size = self.header(position)
            if element is None or element in _TOP_LEVEL or size is None:
                return position if element in _TOP_LEVEL else end
            if element in (_SIMPLE_BLOCK, _BLOCK_GROUP):
                self.blocks += 1
                if self.blocks > self.limit:
                    raise _too_many("blocks (frames)", self.blocks, self.limit, counted_all=False)
            position = body + size
        return end


class _AviWalk:
    def __init__(self, data: bytes, limit: int) -> None:
        self.data, self.size, self.limit = data, len(data), limit
        self.samples = 0

    def run(self) -> None:
        position = 0
        while position + 12 <= self.size and self.data[position : position + 4] == b"RIFF":
            (length,) = struct.unpack_from("<I", self.data, position + 4)
            end = min(position + 8 + length, self.size)
            self.chunks(position + 12, end)
            position = end + (length & 1)

    def chunks(self, start: int, end: int, in_movi: bool = False) -> None:
        position = start
        while position + 8 <= end:
            kind = bytes(self.data[position : position + 4])
            (length,) = struct.unpack_from("<I", self.data, position + 4)
            body = position + 8
            if kind == b"LIST" and length >= 4:
                listed = bytes(self.data[body : body + 4])
                self.chunks(body + 4, min(body + length, end), in_movi=listed == b"movi")
            elif kind == b"idx1":
                self.inside(kind, body, length)
                if length // 16 > self.limit:
                    raise _too_many("entries in its idx1 index", length // 16, self.limit)
            elif kind == b"indx" or kind[:2] == b"ix":
                self.index(kind, body, length)
            elif in_movi:
                self.samples += 1
                if self.samples > self.limit:
                    raise _too_many(
                        "chunks (frames) in its movi list", self.samples, self.limit, counted_all=False
                    )
            position = body + length + (length & 1)

    def inside(self, kind: bytes, body: int, length: int) -> None:
        if body + length > self.size:
            raise _Found(
                f"its '{kind.decode('latin-1')}' index claims {length} bytes, beyond the end of the file "
                "(the file is damaged or made to exhaust memory)"
            )

    def index(self, kind: bytes, body: int, length: int) -> None:
        """An OpenDML index (indx, ix##): its entries fit in its chunk and the limit; an index of indexes
        points inside the file at indexes whose durations add up to no more than the limit."""
        self.inside(kind, body, length)
        if length < 24:
            raise _Found(f"its '{kind.decode('latin-1')}' index is too short to be one (the file is damaged)")
        longs, _, index_type, entries = struct.unpack_from("<HBBI", self.data, body)
        name = kind.decode("latin-1")
        if entries * longs * 4 > length - 24:
            raise _Found(
                f"its '{name}' index claims {entries} entries, more than its chunk of {length} bytes holds "
                "(the file is damaged)"
            )
        if entries > self.limit:
            raise _too_many(f"entries in its '{name}' index", entries, self.limit)
        if index_type != _AVI_INDEX_OF_INDEXES or longs != 4:
            return
        duration = 0
        table = self.data[body + 24 : body + 24 + entries * 16]
        for offset, size, frames in struct.iter_unpack("<QII", table):
            if offset + size > self.size:
                raise _Found(f"its '{name}' index points beyond the end of the file (the file is damaged)")
            duration += frames
        if duration > self.limit:
            raise _too_many(f"frames in its '{name}' index", duration, self.limit)
