"""Hostile and awkward video files: `make_bad_videos(directory, secret)` writes them, with what must happen.

`secret` is a real video elsewhere on the machine, which several of these files name (by absolute file://
address, by absolute path, by a relative path, through a concat list); none of its frames may ever be
decoded through them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np

SECRET_COLOUR = (255, 0, 255)  # RGB of every frame of the secret video


@dataclass(frozen=True)
class BadVideo:
    path: Path
    error: str | None  # a substring of the refusal; None when the file is a video that must run


def write_video(path: Path, frames: int, size: tuple[int, int], fps: float, colour=(40, 120, 200)) -> Path:
    """An mp4v video of `frames` frames of `size` (width, height) in one RGB colour, written by OpenCV."""
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = cv2.VideoWriter(os.fspath(path), cv2.VideoWriter_fourcc(*"mp4v"), fps, size)
    frame = np.zeros((size[1], size[0], 3), np.uint8)
    frame[:] = colour[::-1]
    for _ in range(frames):
        writer.write(frame)
    writer.release()
    return path


def _playlist(target: str) -> bytes:
    return f"#EXTM3U\n#EXT-X-TARGETDURATION:10\n#EXTINF:10.0,\n{target}\n#EXT-X-ENDLIST\n".encode()


NOT_A_VIDEO = "is not a video in a supported format"


def make_bad_videos(directory: Path, secret: Path) -> dict[str, BadVideo]:
    """Write every case into `directory` (the secret's folder is elsewhere) and return them by name."""
    directory.mkdir(parents=True, exist_ok=True)
    relative = os.path.relpath(secret, directory)
    files = {
        "hls_file_url.m3u8": (_playlist(f"file://{secret}"), "HLS playlist"),
        "hls_absolute.m3u8": (_playlist(str(secret)), "HLS playlist"),
        "hls_relative.m3u8": (_playlist(relative), "HLS playlist"),
        "hls_named_mp4.mp4": (_playlist(f"file://{secret}"), "HLS playlist"),
        "hls_self.m3u8": (_playlist("hls_self.m3u8"), "HLS playlist"),
        "hls_bom_spaces.webm": (b"\xef\xbb\xbf  \n" + _playlist(str(secret)), "HLS playlist"),
        "concat.mp4": (f"ffconcat version 1.0\nfile '{secret}'\n".encode(), "concat list"),
        "concat_plain.avi": (f"file '{secret}'\n".encode(), NOT_A_VIDEO),
        "sdp.mov": (
            b"v=0\no=- 0 0 IN IP4 127.0.0.1\ns=x\nc=IN IP4 127.0.0.1\nm=video 5004 RTP/AVP 96\n",
            "SDP",
        ),
        "pattern_%03d.mp4": (b"\x89PNG\r\n\x1a\n" + bytes(64), "PNG image"),
        "url.mkv": (b"http://127.0.0.1:9/clip.mp4\n", NOT_A_VIDEO),
        "empty.mp4": (b"", "empty"),
        "riff_wave.avi": (b"RIFF\x24\x00\x00\x00WAVEfmt " + bytes(32), NOT_A_VIDEO),
        "heif_image.mov": (b"\x00\x00\x00\x18ftypheic" + bytes(64), "an image"),
    }
    cases = {}
    for name, (data, error) in files.items():
        path = directory / name
        path.write_bytes(data)
        cases[name] = BadVideo(path, error)
    # An MP4 under a .webm name: the content decides, and it runs.
    disguised = directory / "really_mp4.webm"
    disguised.write_bytes(write_video(directory / "tmp.mp4", 3, (96, 64), 12.0).read_bytes())
    (directory / "tmp.mp4").unlink()
    cases["really_mp4.webm"] = BadVideo(disguised, None)
    return cases
