"""What a decoder would spend time on, counted from a file's structure before it is decoded.

A JPEG's decoding time grows with its scans (each progressive pass re-reads the whole image): they are
counted here from its markers alone, which costs a read of the bytes and no pixel. (What a video makes
FFmpeg index is counted in sapiens2.vision.video_indexes.)
"""

from __future__ import annotations

import re

# A marker is 0xFF then a code; 0xFF00 is a stuffed byte inside scan data, 0xFFD0-D7 restart markers and
# 0xFFFF fill, none of which starts a segment.
_JPEG_MARKER = re.compile(rb"\xff[^\x00\xd0-\xd7\xff]")
_JPEG_NO_LENGTH = frozenset({0x01, 0xD8})  # TEM and SOI stand alone; every other marker has a length
_JPEG_SOS, _JPEG_EOI = 0xDA, 0xD9


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
