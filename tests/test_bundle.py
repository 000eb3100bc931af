"""The All tasks zip (`sapiens2/outputs/bundle.py`), read back by Python's zipfile: every file whole under its
task's folder, deflated where that pays and stored where it does not (PNGs, noisy float arrays), no partial
zip left behind."""

from __future__ import annotations

import zipfile

import cv2
import numpy as np
import pytest

from sapiens2.outputs.bundle import member_compression, write_zip


@pytest.fixture
def files(tmp_path):
    rng = np.random.default_rng(0)
    _, png = cv2.imencode(".png", rng.integers(0, 256, (900, 1200), np.uint8))
    made = {
        "pose/photo_pose.json": b'{"people": []}' * 2000,  # text: compresses well
        "segment/photo_segmentation.npy": np.zeros((3000, 4000), np.uint8).tobytes(),  # flat labels
        "normals/photo_normals.npy": rng.standard_normal((600, 800, 3)).astype(np.float32).tobytes(),
        "matting/photo_alpha.png": png.tobytes(),
    }
    for name, data in made.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(data)
    return tmp_path, made


def test_every_file_is_whole_under_its_task_folder(files):
    root, made = files
    path = write_zip(root / "photo_all_tasks.zip", [root / name for name in made], root)
    with zipfile.ZipFile(path) as archive:
        assert archive.testzip() is None  # every member's CRC checked
        assert sorted(archive.namelist()) == sorted(made)
        for name, data in made.items():
            assert archive.read(name) == data
    assert [p.name for p in root.iterdir() if p.name.startswith(".")] == []  # no partial zip left


def test_only_what_shrinks_is_deflated(files):
    root, made = files
    path = write_zip(root / "all.zip", [root / name for name in made], root)
    with zipfile.ZipFile(path) as archive:
        kinds = {info.filename: info.compress_type for info in archive.infolist()}
        sizes = {info.filename: info.compress_size / info.file_size for info in archive.infolist()}
    assert kinds["pose/photo_pose.json"] == kinds["segment/photo_segmentation.npy"] == zipfile.ZIP_DEFLATED
    assert sizes["segment/photo_segmentation.npy"] < 0.01
    assert kinds["normals/photo_normals.npy"] == kinds["matting/photo_alpha.png"] == zipfile.ZIP_STORED


def test_the_choice_reads_the_middle_and_end_of_a_large_file(tmp_path):
    # Compressible at its start only (a header, say): judged by the median sample, it is stored.
    path = tmp_path / "points.ply"
    noise = np.random.default_rng(1).integers(0, 256, 4_000_000, np.uint8).tobytes()
    path.write_bytes(b"ply\n" + b"\0" * 300_000 + noise)
    assert member_compression(path) == zipfile.ZIP_STORED
    path.write_bytes(noise + b"\0" * 300_000)  # and so with a trailer
    assert member_compression(path) == zipfile.ZIP_STORED
    path.write_bytes(b"\0" * 4_000_000 + noise[:300_000])  # flat but for its end: deflated
    assert member_compression(path) == zipfile.ZIP_DEFLATED
    path.write_bytes(b"")
    assert member_compression(path) == zipfile.ZIP_STORED
