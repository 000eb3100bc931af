"""Which files are videos: decided from the file's own first bytes before FFmpeg sees it.

Only three container families are decoded, each recognized by its signature: ISO base media (MP4, MOV:
a `ftyp` box, or an old QuickTime file starting with `moov`, `mdat`, `wide`, `free` or `skip`),
EBML (WebM, Matroska) and RIFF AVI. Everything else is refused with one sentence, whatever its name:
HLS playlists, concat lists, SDP files, image sequences, text naming a URL. Those formats can name other
files or network addresses, which FFmpeg would open.

FFmpeg itself is then held to the same rule, in case a file that passes the check still tries: OpenCV reads
OPENCV_FFMPEG_CAPTURE_OPTIONS at every open of a capture (cap_ffmpeg_impl.hpp looks it up) and hands it to
`avformat_open_input`; it is set once, here at import, before any capture exists, and never written again
(so no thread ever reads it while it changes). With it FFmpeg may open local files only
(`protocol_whitelist`), through the MOV/MP4, Matroska/WebM and AVI demuxers only (`format_whitelist`:
the HLS, concat and image2 demuxers are refused even when FFmpeg's own probe picks them), and never follows
an MP4's data references to another file (`enable_drefs=0`, `use_absolute_path=0`). Captures open through
the FFmpeg backend by name (never OpenCV's image-sequence backend, which reads `img%03d.jpg` patterns), and
FFmpeg is given /proc/self/fd/N of the descriptor that was checked, so the file cannot be swapped between
the check and the open.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import cv2

from sapiens2.errors import Sapiens2Error
from sapiens2.settings import export
from sapiens2.vision.files import file_problem, open_regular
from sapiens2.vision.images import sanitize_filename
from sapiens2.vision.limits import Limits
from sapiens2.vision.video_indexes import avi_index_problem, matroska_index_problem, mp4_index_problem

DEMUXERS = "mov,mp4,m4a,3gp,3g2,mj2,matroska,webm,avi"
CAPTURE_OPTIONS = f"protocol_whitelist;file|format_whitelist;{DEMUXERS}|enable_drefs;0|use_absolute_path;0"
export("OPENCV_FFMPEG_CAPTURE_OPTIONS", CAPTURE_OPTIONS, keep=False)

ACCEPTED = "Please send an MP4, MOV, WebM, MKV or AVI video file."
_HEAD_BYTES = 64
_QUICKTIME_FIRST_BOXES = (b"moov", b"mdat", b"wide", b"free", b"skip")
_IMAGE_BRANDS = (b"heic", b"heix", b"heim", b"heis", b"hevc", b"mif1", b"msf1", b"avif", b"avis")
# What a refused file looks like, to say so (the first match wins); none of these is ever decoded.
_REFUSED = (
    (b"#EXTM3U", "an HLS playlist"),
    (b"ffconcat", "a concat list"),
    (b"v=0", "an SDP session description"),
    (b"\x89PNG", "a PNG image"),
    (b"\xff\xd8\xff", "a JPEG image"),
    (b"GIF8", "a GIF image"),
    (b"<", "a text or XML document"),
    (b"[playlist]", "a playlist"),
)


class VideoError(Sapiens2Error, ValueError):
    """A video cannot be read or written; the message says which and why."""


def container(head: bytes) -> str | None:
    """'MP4/MOV', 'WebM/Matroska' or 'AVI' from a file's first bytes; None for anything else."""
    box = head[4:8]
    if box == b"ftyp":
        return None if head[8:12] in _IMAGE_BRANDS else "MP4/MOV"
    if box in _QUICKTIME_FIRST_BOXES:
        return "MP4/MOV"
    if head[:4] == b"\x1a\x45\xdf\xa3":
        return "WebM/Matroska"
    if head[:4] == b"RIFF" and head[8:12] == b"AVI ":
        return "AVI"
    return None


def _refusal(head: bytes, name: str) -> VideoError:
    if not head:
        return VideoError(f"'{name}' is empty (0 bytes). {ACCEPTED}")
    stripped = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    looks = next((words for magic, words in _REFUSED if stripped.startswith(magic)), None)
    if head[4:8] == b"ftyp":
        looks = "an image (HEIF or AVIF)"
    what = f" (it looks like {looks})" if looks else ""
    return VideoError(f"'{name}' is not a video in a supported format{what}. {ACCEPTED}")


@contextlib.contextmanager
def checked_video(path: str | os.PathLike) -> Iterator[str]:
    """Yields the name under which FFmpeg may open `path`, once its bytes say it is a supported video.

    Raises VideoError (a sentence with the file's bare name) for anything else: no such file, a folder, a
    FIFO or device, a loop of links, or a file that is not MP4/MOV, WebM/Matroska or AVI.
    """
    name = sanitize_filename(os.fsdecode(os.fspath(path)), default="video")
    try:
        file = open_regular(path)
    except ValueError:
        raise VideoError("The file name is not valid (it contains a NUL character).") from None
    except OSError as error:
        raise VideoError(file_problem(error, name, "a video file")) from None
    with file:
        head = file.read(_HEAD_BYTES)
        kind = container(head)
        if kind is None:
            raise _refusal(head, name)
        _check_indexes(file, kind, name)
        pinned = f"/proc/self/fd/{file.fileno()}"
        yield pinned if os.path.exists(pinned) else os.path.abspath(path)


_INDEX_PROBLEMS = {
    "MP4/MOV": mp4_index_problem,
    "WebM/Matroska": matroska_index_problem,
    "AVI": avi_index_problem,
}


def _check_indexes(file, kind: str, name: str) -> None:
    """Refuse a video whose sample tables or indexes would make FFmpeg build an index beyond the file or
    the limit."""
    limit = Limits.of().video_samples
    problem = _INDEX_PROBLEMS[kind](file, limit)
    if problem:
        raise VideoError(
            f"'{name}' cannot be opened as a video: {problem}. Please re-export the video (shorter than "
            f"{limit} frames) and try again."
        )


def open_capture(name: str, shown: str) -> cv2.VideoCapture:
    """An OpenCV capture of a name given by checked_video, through FFmpeg only; VideoError if it fails."""
    capture = cv2.VideoCapture(name, cv2.CAP_FFMPEG)
    if not capture.isOpened():
        capture.release()
        raise VideoError(
            f"'{shown}' cannot be opened as a video: it is damaged, or uses a codec this server cannot "
            f"decode. {ACCEPTED}"
        )
    return capture


def bare_name(path: str | os.PathLike) -> str:
    """The file's bare, printable name for messages."""
    return sanitize_filename(Path(os.fsdecode(os.fspath(path))).name, default="video")
