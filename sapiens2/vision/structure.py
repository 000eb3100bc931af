"""What a decoder would spend time or memory on, counted from a file's structure before it is decoded.

A JPEG's decoding time grows with its scans (each progressive pass re-reads the whole image), and FFmpeg
builds an index entry for every sample an MP4/MOV's sample tables claim; both are counted here from the
markers and box headers alone, which costs a read of the bytes and no pixel.
"""

from __future__ import annotations

import re
import struct
from typing import IO

import numpy as np

# A marker is 0xFF then a code; 0xFF00 is a stuffed byte inside scan data, 0xFFD0-D7 restart markers and
# 0xFFFF fill, none of which starts a segment.
_JPEG_MARKER = re.compile(rb"\xff[^\x00\xd0-\xd7\xff]")
_JPEG_NO_LENGTH = frozenset({0x01, 0xD8})  # TEM and SOI stand alone; every other marker has a length
_JPEG_SOS, _JPEG_EOI = 0xDA, 0xD9

_MP4_CONTAINERS = frozenset({b"moov", b"trak", b"mdia", b"minf", b"stbl", b"moof", b"traf"})
_MP4_MAX_BOXES = 100_000  # a ten-minute fragmented clip has a few thousand
# Sample tables whose entry count follows the version and flags: bytes per entry.
_MP4_TABLES = {b"stco": 4, b"co64": 8, b"stts": 8, b"stsc": 12, b"ctts": 8, b"stss": 4}
_TRUN_FIELDS = (0x100, 0x200, 0x400, 0x800)  # flags of the per-sample duration, size, flags, time offset


def jpeg_scans(data: bytes, stop_after: int) -> int:
    """The scans (SOS segments) of a JPEG, counted from its markers; counting stops past `stop_after`."""
    scans, position = 0, 2
    while scans <= stop_after:
        marker = _JPEG_MARKER.search(data, position)
        if marker is None:
            break
        code, position = data[marker.start() + 1], marker.end()
        if code == _JPEG_EOI:
            break
        if code in _JPEG_NO_LENGTH:
            continue
        position += int.from_bytes(data[position : position + 2], "big")
        scans += code == _JPEG_SOS
    return scans


def mp4_table_problem(file: IO[bytes], samples_limit: int) -> str | None:
    """What is wrong with an MP4/MOV's sample tables (as the end of a sentence), or None when they fit.

    Every table must fit in its box, and claim no more samples than `samples_limit` or the file has bytes.
    """
    file_size = file.seek(0, 2)
    return _walk(file, 0, file_size, file_size, samples_limit, [0])


def _walk(file: IO[bytes], start: int, end: int, file_size: int, limit: int, boxes: list[int]) -> str | None:
    position = start
    while position + 8 <= end:
        boxes[0] += 1
        if boxes[0] > _MP4_MAX_BOXES:
            return f"it holds more than {_MP4_MAX_BOXES} boxes"
        file.seek(position)
        size, kind = struct.unpack(">I4s", file.read(8))
        header = 8
        if size == 1:
            size, header = struct.unpack(">Q", file.read(8))[0], 16
        elif size == 0:
            size = end - position
        if size < header:
            return f"its '{_printable(kind)}' box claims {size} bytes, less than its own header"
        size = min(size, end - position)  # as FFmpeg reads a box that runs past its container: cut short
        body, box_end = position + header, position + size
        if kind in _MP4_CONTAINERS:
            problem = _walk(file, body, box_end, file_size, limit, boxes)
        else:
            problem = _table_problem(file, kind, body, box_end - body, file_size, limit)
        if problem:
            return problem
        position = box_end
    return None


def _table_problem(
    file: IO[bytes], kind: bytes, body: int, length: int, file_size: int, limit: int
) -> str | None:
    counted = _table_counts(file, kind, body, length)
    if counted is None:
        return None
    entries, entry_bits, samples = counted
    name = kind.decode("ascii")
    if entries * entry_bits > length * 8:
        return (
            f"its sample table '{name}' claims {entries} entries, more than its box of {length} bytes holds "
            "(the file is damaged)"
        )
    if samples > file_size:
        return (
            f"its sample table '{name}' claims {samples} samples, more than a file of {file_size} bytes "
            "can hold (the file is damaged or made to exhaust memory)"
        )
    if samples > limit:
        return (
            f"its sample table '{name}' claims {samples} samples, above this server's limit of {limit} "
            "samples per table"
        )
    return None


def _table_counts(file: IO[bytes], kind: bytes, body: int, length: int) -> tuple[int, int, int] | None:
    """(entries, bits per entry, samples the entries stand for) of a sample table; None for other boxes."""
    file.seek(body)
    head = file.read(min(length, 16))
    if kind in _MP4_TABLES and len(head) >= 8:
        (entries,) = struct.unpack(">I", head[4:8])
        samples = _stts_samples(file, body + 8, entries, length - 8) if kind == b"stts" else entries
        return entries, _MP4_TABLES[kind] * 8, samples
    if kind in (b"stsz", b"stz2") and len(head) >= 12:
        sample_size, count = struct.unpack(">II", head[4:12])
        entry_bits = (sample_size & 0xFF) if kind == b"stz2" else (0 if sample_size else 32)
        return count, entry_bits, count
    if kind == b"trun" and len(head) >= 8:
        flags, count = struct.unpack(">II", head[:8])
        return count, 32 * sum(bool(flags & field) for field in _TRUN_FIELDS), count
    return None


def _stts_samples(file: IO[bytes], start: int, entries: int, room: int) -> int:
    """The samples a time-to-sample table stands for: the sum of its entries' counts (those that fit)."""
    file.seek(start)
    table = np.frombuffer(file.read(min(entries, room // 8) * 8), dtype=">u4")
    return int(table[0::2].sum(dtype=np.uint64))


def _printable(kind: bytes) -> str:
    return "".join(chr(byte) if 32 <= byte < 127 else "?" for byte in kind)
