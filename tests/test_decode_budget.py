"""Inputs within the pixel and byte limits that cost minutes or gigabytes to decode, refused from their
structure first: a JPEG with thousands of scans, an MP4 whose sample table claims millions of samples."""

from __future__ import annotations

import io
import struct
import zlib
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


# ---- MP4/MOV: what FFmpeg would index for the whole file, compressed movie headers included ---------------

FTYP = box(b"ftyp", b"isom\x00\x00\x02\x00isomiso2mp41")


def track(samples: int, media_edits: int = 0, empty_edits: int = 0) -> bytes:
    """A trak whose tables claim `samples` one-byte samples, with an edit list of `media_edits` edits that
    show them (and `empty_edits` that show nothing)."""
    stbl = box(
        b"stbl",
        box(b"stts", struct.pack(">IIII", 0, 1, samples, 1))
        + box(b"stsz", struct.pack(">III", 0, 1, samples)),
    )
    edits = [(1000, 0, 1 << 16)] * media_edits + [(1000, -1, 1 << 16)] * empty_edits
    elst = struct.pack(">II", 0, len(edits)) + b"".join(struct.pack(">IiI", *edit) for edit in edits)
    edts = box(b"edts", box(b"elst", elst)) if edits else b""
    return box(b"trak", edts + box(b"mdia", box(b"minf", stbl)))


def mp4(moov_body: bytes, payload: int = 4096) -> bytes:
    return FTYP + box(b"moov", moov_body) + box(b"mdat", b"\x00" * payload)


def compressed(moov_body: bytes, claimed: int | None = None) -> bytes:
    """A movie header compressed as QuickTime does it: moov/cmov holding dcom ('zlib') and cmvd (the
    inflated size, then the zlib stream of a whole moov box)."""
    inner = box(b"moov", moov_body)
    size = len(inner) if claimed is None else claimed
    return box(
        b"cmov", box(b"dcom", b"zlib") + box(b"cmvd", struct.pack(">I", size) + zlib.compress(inner, 9))
    )


def fragments(runs: int, samples: int) -> bytes:
    trun = box(b"trun", struct.pack(">II", 0, samples))
    return b"".join(box(b"moof", box(b"traf", trun)) for _ in range(runs))


@pytest.mark.parametrize(
    "name, data, expected",
    [
        # 85 million samples behind zlib: a 300-byte upload cost FFmpeg +2.85 GiB
        (
            "hidden.mov",
            mp4(compressed(track(85_000_000))),
            "claims 85000000 samples, more than a file of",
        ),
        (
            "claims_4gb.mov",
            mp4(compressed(b"", claimed=2**32 - 1)),
            "unpacks to more than this server's limit",
        ),
        (
            "bomb.mov",
            mp4(
                box(
                    b"cmov",
                    box(b"dcom", b"zlib")
                    + box(b"cmvd", struct.pack(">I", 64) + zlib.compress(bytes(17 * 2**20), 9)),
                )
            ),
            "unpacks to more than this server's limit",
        ),
        (
            "not_zlib.mov",
            mp4(box(b"cmov", box(b"dcom", b"lzma") + box(b"cmvd", b"\x00" * 8))),
            "compressed in a way",
        ),
        (
            "broken_zlib.mov",
            mp4(box(b"cmov", box(b"dcom", b"zlib") + box(b"cmvd", struct.pack(">I", 64) + b"junk" * 4))),
            "cannot be unpacked",
        ),
    ],
    ids=lambda value: value if isinstance(value, str) and "." in value[-5:] else "file",
)
def test_a_compressed_movie_header_is_inflated_within_bounds_and_checked(tmp_path, name, data, expected):
    message = refusal(tmp_path, name, data)
    assert expected in message and message.endswith("and try again.")


@pytest.mark.parametrize(
    "name, moov_body, expected",
    [
        ("two_tracks.mp4", track(600) * 2, "claims 1200 samples in its tracks"),
        ("ten_tracks.mp4", track(101) * 10, "claims 1010 samples in its tracks"),
        ("replayed.mp4", track(300, media_edits=4), "claims 1200 samples in its tracks"),
        ("compressed_tracks.mov", compressed(track(400) * 3), "claims 1200 samples in its tracks"),
        ("fragments.mp4", track(10) + fragments(3, 400), "samples in its tables and fragments"),
        ("many_tracks.mp4", track(1) * 65, "it holds 65 tracks, above this server's limit of 64"),
    ],
    ids=lambda value: value if isinstance(value, str) and "." in value[-5:] else "file",
)
def test_an_mp4_is_bounded_by_what_the_whole_file_claims(tmp_path, monkeypatch, name, moov_body, expected):
    # Every table of these files is within the limit; the file as a whole is not.
    monkeypatch.setenv("SAPIENS2_MAX_VIDEO_SAMPLES", "1000")
    message = refusal(tmp_path, name, mp4(moov_body))
    assert expected in message and "above this server's limit of" in message


def test_tracks_edits_and_compressed_headers_within_the_limits_pass_the_check(tmp_path, monkeypatch):
    monkeypatch.setenv("SAPIENS2_MAX_VIDEO_SAMPLES", "1000")
    for index, moov_body in enumerate(
        [track(300) * 3, track(300, media_edits=3, empty_edits=50), compressed(track(500) * 2), track(1) * 64]
    ):
        path = tmp_path / f"fits{index}.mp4"
        path.write_bytes(mp4(moov_body))
        with checked_video(path) as name:
            assert name


def test_an_mp4_with_an_edit_list_and_a_compressed_header_still_runs(tmp_path):
    # A real clip whose movie header is moved into a cmov: the check inflates it and FFmpeg still reads it.
    clip = write_video(tmp_path / "clip.mp4", 5, (64, 48), 10.0).read_bytes()
    start = clip.index(b"moov") - 4
    (size,) = struct.unpack(">I", clip[start : start + 4])
    if clip[start + size :]:
        pytest.skip("the writer put the movie header before the samples")
    path = tmp_path / "cmov.mov"
    path.write_bytes(clip[:start] + box(b"moov", compressed(clip[start + 8 : start + size])))
    with checked_video(path) as name:
        capture = open_capture(name, "cmov.mov")
        frames = 0
        while capture.read()[0] and frames < 10:
            frames += 1
        capture.release()
    assert frames == 5


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


def test_matroska_and_avi_indexes_are_bounded_for_the_whole_file(tmp_path, monkeypatch):
    # Each index within the limit, the file's indexes together above it; tracks beyond the limit.
    monkeypatch.setenv("SAPIENS2_MAX_VIDEO_SAMPLES", "1000")
    two_cues = matroska(ebml(CUES, b"\xbb\x80" * 600), ebml(CUES, b"\xbb\x80" * 600))
    assert "more than 1000 Cues entries" in refusal(tmp_path, "a.webm", two_cues)
    positions = ebml(0xBB, ebml(0xB3, b"\x00") + ebml(0xB7, ebml(0xF7, b"\x01")) * 40)
    assert "more than 1000 Cues entries" in refusal(tmp_path, "b.webm", matroska(ebml(CUES, positions * 30)))
    tracks = matroska(ebml(0x1654AE6B, ebml(0xAE, ebml(0xD7, b"\x01")) * 65))
    assert "it holds 65 tracks, above this server's limit of 64" in refusal(tmp_path, "c.webm", tracks)
    indexes = avi(
        riff(b"idx1", b"\x00" * 16 * 600),
        riff(b"LIST", b"strl" + riff(b"indx", struct.pack("<HBBI", 2, 0, 1, 600) + b"\x00" * (16 + 600 * 8))),
    )
    assert "1200 entries in its index chunks together" in refusal(tmp_path, "d.avi", indexes)
    streams = avi(*[riff(b"LIST", b"strl" + riff(b"strh", b"\x00" * 56))] * 65)
    assert "it holds 65 tracks" in refusal(tmp_path, "e.avi", streams)


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
