"""Inputs within the pixel and byte limits that cost minutes or gigabytes to decode, refused from their
structure first: a JPEG with thousands of scans, an MP4 whose sample table claims millions of samples."""

from __future__ import annotations

import io
import struct
from pathlib import Path

import cv2
import numpy as np
import pytest
from bad_inputs import PHOTO
from bad_videos import write_video
from PIL import Image

from sapiens2.vision.decode_workers import decoding_in_workers
from sapiens2.vision.images import ImageInputError, load_image
from sapiens2.vision.structure import jpeg_scans
from sapiens2.vision.video_files import VideoError, checked_video, open_capture

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


# ---- Matroska/WebM and AVI: their indexes are checked like an MP4's sample tables -----------------------


def ebml(element: int, body: bytes = b"", size: int | None = None) -> bytes:
    """A Matroska element: its ID, an 8-byte size (the body's, or the one claimed) and its body."""
    claimed = len(body) if size is None else size
    return (
        element.to_bytes((element.bit_length() + 7) // 8, "big")
        + (1 << 56 | claimed).to_bytes(8, "big")
        + body
    )


def matroska(*top_level: bytes) -> bytes:
    """A WebM file: an EBML header naming the webm doc type, then a segment of `top_level` elements."""
    return ebml(0x1A45DFA3, ebml(0x4282, b"webm")) + ebml(0x18538067, b"".join(top_level))


def riff(kind: bytes, body: bytes, size: int | None = None) -> bytes:
    return kind + struct.pack("<I", len(body) if size is None else size) + body + b"\x00" * (len(body) & 1)


def avi(*chunks: bytes) -> bytes:
    header = riff(b"LIST", b"hdrl" + riff(b"avih", b"\x00" * 56))
    return riff(b"RIFF", b"AVI " + header + b"".join(chunks))


def refusal(tmp_path: Path, name: str, data: bytes) -> str:
    path = tmp_path / name
    path.write_bytes(data)
    with pytest.raises(VideoError) as refused:
        with checked_video(path):
            pass
    return str(refused.value)


CUES, SEEK_HEAD = 0x1C53BB6B, 0x114D9B74


@pytest.mark.parametrize(
    "name, data, expected",
    [
        (
            "cues_beyond_the_file.webm",
            matroska(ebml(CUES, size=2**40)),
            "its Cues index claims 1099511627776 bytes",
        ),
        (
            "seek_head_beyond_the_file.webm",
            matroska(
                ebml(
                    SEEK_HEAD,
                    ebml(0x4DBB, ebml(0x53AB, CUES.to_bytes(4, "big")) + ebml(0x53AC, b"\x3b\x9a\xca\x00")),
                )
            ),
            "its SeekHead points at a Cues index beyond the end of the file",
        ),
        (
            "idx1_beyond_the_file.avi",
            avi(riff(b"idx1", b"", size=10**9)),
            "'idx1' index claims 1000000000 bytes",
        ),
        (
            "indx_claims_more_than_it_holds.avi",
            avi(riff(b"LIST", b"strl" + riff(b"indx", struct.pack("<HBBI", 4, 0, 0, 2**31) + b"\x00" * 16))),
            "'indx' index claims 2147483648 entries, more than its chunk of 24 bytes holds",
        ),
        (
            "indx_points_beyond_the_file.avi",
            avi(
                riff(
                    b"indx",
                    struct.pack("<HBBI", 4, 0, 0, 1) + b"\x00" * 16 + struct.pack("<QII", 10**9, 4096, 1),
                )
            ),
            "'indx' index points beyond the end of the file",
        ),
    ],
)
def test_matroska_and_avi_indexes_beyond_the_file_are_refused_before_ffmpeg(tmp_path, name, data, expected):
    message = refusal(tmp_path, name, data)
    assert expected in message and message.endswith("and try again.")


def test_matroska_and_avi_indexes_above_the_limit_are_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("SAPIENS2_MAX_VIDEO_SAMPLES", "1000")
    cues = matroska(ebml(CUES, b"\xbb\x80" * 1001))
    assert "more than 1000 Cues entries, above this server's limit of 1000" in refusal(
        tmp_path, "a.webm", cues
    )
    blocks = matroska(ebml(0x1F43B675, b"\xa3\x80" * 1001, size=2**56 - 1))  # a cluster of open size
    assert "more than 1000 blocks (frames)" in refusal(tmp_path, "b.webm", blocks)
    idx1 = avi(riff(b"idx1", b"\x00" * 16 * 1001))
    assert "claims 1001 entries in its idx1 index, above this server's limit of 1000" in refusal(
        tmp_path, "c.avi", idx1
    )
    movi = avi(riff(b"LIST", b"movi" + riff(b"00dc", b"") * 1001))
    assert "more than 1000 chunks (frames) in its movi list" in refusal(tmp_path, "d.avi", movi)


@pytest.mark.parametrize("suffix, fourcc", [(".webm", "VP80"), (".avi", "MJPG")])
def test_ordinary_webm_and_avi_files_still_open(tmp_path, suffix, fourcc):
    path = tmp_path / f"clip{suffix}"
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*fourcc), 10.0, (64, 48))
    for _ in range(5):
        writer.write(np.full((48, 64, 3), 90, np.uint8))
    writer.release()
    with checked_video(path) as name:
        capture = open_capture(name, path.name)
        assert int(capture.get(cv2.CAP_PROP_FRAME_COUNT)) == 5
        capture.release()


# ---- the decode deadline: images decoded in worker processes that can be abandoned ----------------------


def test_images_decoded_in_workers_are_the_images_decoded_here(tmp_path):
    noise = np.random.default_rng(0).integers(0, 256, (1200, 1600, 4), dtype=np.uint8)
    noise[..., 3] = 200  # half transparent: the alpha comes back too, through shared memory
    path = tmp_path / "large.png"
    Image.fromarray(noise).save(path)
    here = [load_image(PHOTO), load_image(path)]
    with decoding_in_workers() as workers:
        there = [load_image(PHOTO), load_image(path.read_bytes())]
        with pytest.raises(ImageInputError, match="not an image in a supported format"):
            load_image(b"not an image at all")
    assert workers.abandoned == 0
    for mine, theirs in zip(here, there, strict=True):
        assert np.array_equal(mine.rgb, theirs.rgb) and mine.notes == theirs.notes
        assert (mine.alpha is None) == (theirs.alpha is None)
    assert np.array_equal(here[1].alpha, there[1].alpha)


def test_a_decode_past_its_deadline_is_abandoned(tmp_path, monkeypatch):
    noise = np.random.default_rng(1).integers(0, 256, (3000, 4000, 3), dtype=np.uint8)
    path = tmp_path / "slow.png"
    Image.fromarray(noise).save(path)
    with decoding_in_workers() as workers:
        monkeypatch.setenv("SAPIENS2_DECODE_SECONDS", "0.05")
        with pytest.raises(ImageInputError, match="longer than this server's limit of 0.05 seconds"):
            load_image(path)
        monkeypatch.delenv("SAPIENS2_DECODE_SECONDS")
        assert load_image(PHOTO).original_size == (600, 512)  # the next decode gets a fresh worker
    assert workers.abandoned == 1
