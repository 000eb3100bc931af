"""Inputs within the pixel and byte limits that cost minutes or gigabytes to decode, refused from their
structure first: a JPEG with thousands of scans, an MP4 whose sample table claims millions of samples."""

from __future__ import annotations

import io
import struct
from pathlib import Path

import pytest
from bad_inputs import PHOTO
from bad_videos import write_video
from PIL import Image

from sapiens2.vision.images import ImageInputError, load_image
from sapiens2.vision.structure import jpeg_scans
from sapiens2.vision.video_files import VideoError, checked_video

SCANS = 3000


def many_scans_jpeg(scans: int) -> bytes:
    """A progressive JPEG of the test photo whose last scan is repeated until it has `scans` scans."""
    buffer = io.BytesIO()
    Image.open(PHOTO).convert("RGB").save(buffer, "JPEG", progressive=True)
    data = buffer.getvalue()
    last = data.rindex(b"\xff\xda")
    extra = scans - jpeg_scans(data, stop_after=10**6)
    return data[:last] + data[last:-2] * (extra + 1) + b"\xff\xd9"


def box(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I4s", 8 + len(body), kind) + body


def claimed_samples_mp4(samples: int) -> bytes:
    """A tiny MP4 whose stsz says every one of `samples` samples has 100 bytes."""
    stsz = box(b"stsz", struct.pack(">III", 0, 100, samples))
    moov = box(b"moov", box(b"trak", box(b"mdia", box(b"minf", box(b"stbl", stsz)))))
    return box(b"ftyp", b"isom\x00\x00\x02\x00isomiso2mp41") + moov + box(b"mdat", b"\x00" * 16)


def test_a_jpeg_with_thousands_of_scans_is_refused_naming_them() -> None:
    data = many_scans_jpeg(SCANS)
    assert jpeg_scans(data, stop_after=10**6) == SCANS
    with pytest.raises(ImageInputError, match=r"has more than 10000 scans|has \d+ scans") as refused:
        load_image(data)
    assert "limit of 100" in str(refused.value)


def test_ordinary_jpegs_still_load() -> None:
    buffer = io.BytesIO()
    Image.open(PHOTO).convert("RGB").save(buffer, "JPEG", progressive=True)
    assert 1 < jpeg_scans(buffer.getvalue(), stop_after=1000) < 20
    assert load_image(buffer.getvalue()).original_size == (600, 512)
    assert load_image(PHOTO).original_size == (600, 512)


def test_an_mp4_claiming_85_million_samples_is_refused_before_ffmpeg(tmp_path: Path) -> None:
    path = tmp_path / "claims.mp4"
    path.write_bytes(claimed_samples_mp4(85_000_000))
    with pytest.raises(VideoError, match="'stsz' claims 85000000 samples, more than a file of"):
        with checked_video(path):
            pass


def test_ordinary_mp4s_still_open(tmp_path: Path) -> None:
    path = write_video(tmp_path / "clip.mp4", 5, (64, 48), 10.0)
    with checked_video(path) as name:
        assert name
