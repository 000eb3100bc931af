"""The indexes a video file makes FFmpeg build, counted for the whole file from box, element and chunk
headers before FFmpeg opens it.

FFmpeg keeps an index entry per sample an MP4/MOV's sample tables claim (per track, and again for each edit
of an edit list that replays them), per cue point, seek entry or block of a Matroska/WebM file, and per
AVI index entry, and reads an index wherever the file says it is. So every table or index must lie inside
the file and hold the entries it claims, and what the whole file claims is bounded: its tracks (at most
`MAX_TRACKS`), and its index entries summed over tracks, tables and chunks (at most the limit).

An MP4/MOV's movie header may be zlib-compressed (`moov/cmov`, which FFmpeg inflates whole): it is inflated
here too, at most `MAX_MOVIE_HEADER` bytes in all, and walked like the rest. Only headers are read, through
a memory map of the file, and each walk stops as soon as a limit is passed.
"""

from __future__ import annotations

import mmap
import struct
import zlib
from typing import IO

import numpy as np

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
_TRACK_ENTRY, _TRACKS, _CUE_TRACK_POSITIONS = 0xAE, 0x1654AE6B, 0xB7

MAX_TRACKS = 64  # FFmpeg accepts 1000; a camera's MOV with every audio channel apart has about 20
MAX_MOVIE_HEADER = 16 * 2**20  # inflated bytes of compressed movie headers: a 1M-sample moov is about 12 MB
_MP4_MAX_BOXES = 100_000  # a ten-minute fragmented clip has a few thousand
_MP4_CONTAINERS = frozenset({b"moov", b"trak", b"mdia", b"minf", b"stbl", b"edts", b"moof", b"traf", b"mvex"})
# Sample tables whose entry count follows the version and flags: bytes per entry.
_MP4_TABLES = {b"stco": 4, b"co64": 8, b"stts": 8, b"stsc": 12, b"ctts": 8, b"stss": 4}
_MP4_RUN_TABLES = frozenset({b"stts", b"ctts"})  # entries of (count, value): samples are the counts' sum
_TRUN_FIELDS = (0x100, 0x200, 0x400, 0x800)  # flags of the per-sample duration, size, flags, time offset
_ELST_ENTRY = {
    0: np.dtype([("duration", ">u4"), ("media_time", ">i4"), ("rate", ">i4")]),
    1: np.dtype([("duration", ">u8"), ("media_time", ">i8"), ("rate", ">i4")]),
}


class _Found(Exception):
    """What is wrong, as the end of a sentence; ends the walk."""


def mp4_index_problem(file: IO[bytes], limit: int) -> str | None:
    """What is wrong with an MP4/MOV's tracks and sample tables (the end of a sentence), or None."""
    return _walk_problem(file, _Mp4Walk, limit)


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


def _too_many_tracks(count: int) -> _Found:
    return _Found(f"it holds {count} tracks, above this server's limit of {MAX_TRACKS}")


def _too_many(what: str, count: int, limit: int, *, counted_all: bool = True) -> _Found:
    """The sentence's end for `count` entries above `limit`; a walk that stopped early counted only
    `limit + 1` of them."""
    claimed = str(count) if counted_all else f"more than {limit}"
    return _Found(f"it claims {claimed} {what}, above this server's limit of {limit}")


class _MatroskaWalk:
    def __init__(self, data: bytes, limit: int) -> None:
        self.data, self.size, self.limit = data, len(data), limit
        self.blocks = self.entries = 0
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
            elif element == _TRACKS and size is not None:
                tracks = sum(
                    child == _TRACK_ENTRY for child, _, _ in self.children(body, min(body + size, end))
                )
                if tracks > MAX_TRACKS:
                    raise _too_many_tracks(tracks)
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
        targets = []
        for child, child_body, child_size in self.children(body, body + size):
            if child == entry:  # a cue point is one index entry per track position it lists
                self.entries += (
                    max(1, self.positions(child_body, child_body + child_size)) if child == _CUE_POINT else 1
                )
            if self.entries > self.limit:
                raise _too_many(f"{name} entries", self.entries, self.limit, counted_all=False)
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

    def positions(self, start: int, end: int) -> int:
        """The track positions (CueTrackPositions) of a cue point."""
        return sum(child == _CUE_TRACK_POSITIONS for child, _, _ in self.children(start, end))

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
        self.samples = self.entries = self.tracks = 0

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
                self.tracks += listed == b"strl"
                if self.tracks > MAX_TRACKS:
                    raise _too_many_tracks(self.tracks)
                self.chunks(body + 4, min(body + length, end), in_movi=listed == b"movi")
            elif kind == b"idx1":
                self.inside(kind, body, length)
                if length // 16 > self.limit:
                    raise _too_many("entries in its idx1 index", length // 16, self.limit)
                self.count_entries(length // 16)
            elif kind == b"indx" or kind[:2] == b"ix":
                self.index(kind, body, length)
            elif in_movi:
                self.samples += 1
                if self.samples > self.limit:
                    raise _too_many(
                        "chunks (frames) in its movi list", self.samples, self.limit, counted_all=False
                    )
            position = body + length + (length & 1)

    def count_entries(self, entries: int) -> None:
        """Index entries of every index chunk of the file, together."""
        self.entries += entries
        if self.entries > self.limit:
            raise _too_many("entries in its index chunks together", self.entries, self.limit)

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
        self.count_entries(entries)
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


class _Track:
    """What one MP4 track's tables claim: the most samples any of them stands for, and the edits that
    replay them."""

    def __init__(self) -> None:
        self.samples = 0
        self.replays = 1


class _Mp4Walk:
    def __init__(self, data: bytes, limit: int) -> None:
        self.file_size, self.limit = len(data), limit
        self.boxes = self.tracks = self.samples = self.inflated = 0
        self.track: _Track | None = None
        self.data = data

    def run(self) -> None:
        self.walk(self.data, 0, len(self.data))

    def walk(self, data: bytes, start: int, end: int) -> None:
        """Every box between `start` and `end` of `data` (the file, or an inflated movie header)."""
        position = start
        while position + 8 <= end:
            self.boxes += 1
            if self.boxes > _MP4_MAX_BOXES:
                raise _Found(f"it holds more than {_MP4_MAX_BOXES} boxes")
            size, kind = struct.unpack_from(">I4s", data, position)
            header = 8
            if size == 1:
                if position + 16 > end:
                    return
                (size,), header = struct.unpack_from(">Q", data, position + 8), 16
            elif size == 0:
                size = end - position
            if size < header:
                raise _Found(f"its '{_printable(kind)}' box claims {size} bytes, less than its own header")
            box_end = min(position + size, end)  # as FFmpeg reads a box that runs past its container
            self.box(data, kind, position + header, box_end)
            position = box_end

    def box(self, data: bytes, kind: bytes, body: int, end: int) -> None:
        if kind == b"trak":
            self.tracks += 1
            if self.tracks > MAX_TRACKS:
                raise _too_many_tracks(self.tracks)
            outer, self.track = self.track, _Track()
            self.walk(data, body, end)
            track, self.track = self.track, outer
            self.count(
                track.samples * track.replays, "samples in its tracks (edit lists that replay them counted)"
            )
        elif kind in _MP4_CONTAINERS:
            self.walk(data, body, end)
        elif kind == b"cmov":
            self.compressed(data, body, end)
        elif kind == b"elst":
            self.edits(data, body, end)
        else:
            self.table(data, kind, body, end)

    def count(self, samples: int, what: str) -> None:
        self.samples += samples
        if self.samples > self.limit:
            raise _Found(
                f"it claims {self.samples} {what}, above this server's limit of {self.limit} samples per file"
            )

    def table(self, data: bytes, kind: bytes, body: int, end: int) -> None:
        """Check a sample table: it fits in its box, and claims no more samples than the file has bytes;
        its samples count toward its track (a fragment's run toward the file)."""
        counted = _table_counts(data, kind, body, end)
        if counted is None:
            return
        entries, entry_bits, samples = counted
        name = kind.decode("ascii")
        if entries * entry_bits > (end - body) * 8:
            raise _Found(
                f"its sample table '{name}' claims {entries} entries, more than its box of {end - body} "
                "bytes holds (the file is damaged)"
            )
        if samples > self.file_size:
            raise _Found(
                f"its sample table '{name}' claims {samples} samples, more than a file of {self.file_size} "
                "bytes can hold (the file is damaged or made to exhaust memory)"
            )
        if samples > self.limit:
            raise _Found(
                f"its sample table '{name}' claims {samples} samples, above this server's limit of "
                f"{self.limit} samples per file"
            )
        if kind == b"trun" or self.track is None:
            self.count(samples, "samples in its tables and fragments")
        else:
            self.track.samples = max(self.track.samples, samples)

    def edits(self, data: bytes, body: int, end: int) -> None:
        """An edit list: each edit that shows media (not an empty edit) makes FFmpeg index the track's
        samples in its range again."""
        if end - body < 8:
            return
        version, entries = data[body], struct.unpack_from(">I", data, body + 4)[0]
        dtype = _ELST_ENTRY.get(version, _ELST_ENTRY[0])
        if entries * dtype.itemsize > end - body - 8:
            raise _Found(
                f"its edit list claims {entries} entries, more than its box of {end - body} bytes holds "
                "(the file is damaged)"
            )
        table = np.frombuffer(data[body + 8 : body + 8 + entries * dtype.itemsize], dtype=dtype)
        if self.track is not None:
            self.track.replays = max(self.track.replays, int(np.count_nonzero(table["media_time"] != -1)))

    def compressed(self, data: bytes, body: int, end: int) -> None:
        """A compressed movie header (cmov: its dcom names the method, its cmvd holds the inflated size and
        the zlib stream): inflated within what is left of `MAX_MOVIE_HEADER`, then walked."""
        method, packed = None, None
        position = body
        while position + 8 <= end:
            size, kind = struct.unpack_from(">I4s", data, position)
            if size < 8:
                break
            if kind == b"dcom":
                method = bytes(data[position + 8 : position + 12])
            elif kind == b"cmvd":
                packed = (position + 8, min(position + size, end))
            position += size
        if method != b"zlib" or packed is None or packed[1] - packed[0] < 4:
            raise _Found(
                "its movie header is compressed in a way this server does not read (the file is damaged)"
            )
        (claimed,) = struct.unpack_from(">I", data, packed[0])
        room = MAX_MOVIE_HEADER - self.inflated
        too_large = _Found(
            f"its compressed movie header unpacks to more than this server's limit of {MAX_MOVIE_HEADER} "
            "bytes (the file is made to exhaust memory)"
        )
        if claimed > room:
            raise too_large
        inflater = zlib.decompressobj()
        try:
            header = inflater.decompress(data[packed[0] + 4 : packed[1]], room + 1)
        except zlib.error:
            raise _Found("its compressed movie header cannot be unpacked (the file is damaged)") from None
        if len(header) > room:
            raise too_large
        self.inflated += len(header)
        self.walk(header, 0, len(header))


def _table_counts(data: bytes, kind: bytes, body: int, end: int) -> tuple[int, int, int] | None:
    """(entries, bits per entry, samples the entries stand for) of a sample table; None for other boxes."""
    head = data[body : min(end, body + 16)]
    if kind in _MP4_TABLES and len(head) >= 8:
        (entries,) = struct.unpack(">I", head[4:8])
        samples = entries
        if kind in _MP4_RUN_TABLES:  # the sum of the counts of the entries that fit
            table = np.frombuffer(data[body + 8 : body + 8 + min(entries, (end - body - 8) // 8) * 8], ">u4")
            samples = int(table[0::2].sum(dtype=np.uint64))
        return entries, _MP4_TABLES[kind] * 8, samples
    if kind in (b"stsz", b"stz2") and len(head) >= 12:
        sample_size, count = struct.unpack(">II", head[4:12])
        entry_bits = (sample_size & 0xFF) if kind == b"stz2" else (0 if sample_size else 32)
        return count, entry_bits, count
    if kind == b"trun" and len(head) >= 8:
        flags, count = struct.unpack(">II", head[:8])
        return count, 32 * sum(bool(flags & field) for field in _TRUN_FIELDS), count
    return None


def _printable(kind: bytes) -> str:
    return "".join(chr(byte) if 32 <= byte < 127 else "?" for byte in kind)
