"""Videos with --ray, motion capture on: a video named alone and a folder of videos give the same files as
without --ray (each video is one Ray task running the command line's own video engine), read back by
independent readers (bvhio, pygltflib) and compared within float tolerance. A local Ray cluster of 2 CPUs,
tiny random checkpoints and a detector that finds a few large persons in any frame."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("ray.data", reason="the scale extra (requirements-scale.txt) is not installed")

import ray  # noqa: E402
import torch  # noqa: E402
from test_cli import run_cli  # noqa: E402
from test_video import write_clip  # noqa: E402

from sapiens2.batch.report import EXIT_OK  # noqa: E402

TOLERANCE = 1e-4  # metres, degrees and pixels: the same arithmetic, in another process
COMPONENTS = {
    5120: np.int8,
    5121: np.uint8,
    5122: np.int16,
    5123: np.uint16,
    5125: np.uint32,
    5126: np.float32,
}


@pytest.fixture(scope="module")
def ray_session():
    """One local Ray cluster of 2 CPUs for the module."""
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def clips(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("clips")
    (folder / "more").mkdir()
    write_clip(folder / "walk.mp4", count=4)
    write_clip(folder / "more" / "again.mp4", count=3)
    return folder


def _files(folder: Path) -> set[str]:
    return {str(path.relative_to(folder)) for path in folder.rglob("*") if path.is_file()}


def _close(a, b, where: str) -> None:
    """Two parsed JSON values alike: the same keys, lists and strings, numbers within TOLERANCE."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), where
        for key in a:
            _close(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), where
        for index, (x, y) in enumerate(zip(a, b, strict=True)):
            _close(x, y, f"{where}[{index}]")
    elif isinstance(a, (int, float)) and not isinstance(a, bool):
        assert isinstance(b, (int, float)) and abs(a - b) <= TOLERANCE * max(1.0, abs(a)), (where, a, b)
    elif not where.endswith((".seconds", ".timings", "seconds_per_frame")):
        assert a == b, (where, a, b)


def _number(word: str) -> float | str:
    try:
        return float(word)
    except ValueError:
        return word


def _bvh(path: Path) -> tuple[list, np.ndarray]:
    """A BVH file's hierarchy and frame count and time (words, numbers as floats), and its motion (frames x
    channels)."""
    import bvhio

    root = bvhio.readAsHierarchy(str(path))
    assert len(root.layout()) == 50
    hierarchy, motion = path.read_text().split("MOTION", 1)
    lines = motion.strip().splitlines()
    rows = [line.split() for line in lines[2:]]  # after Frames: and Frame Time:
    words = [_number(word) for word in (hierarchy + lines[0] + lines[1]).split()]
    return words, np.array(rows, dtype=float)


def _glb(path: Path) -> tuple[dict, list[np.ndarray]]:
    """A GLB file's document (without its buffer's length) and the data of each accessor."""
    import pygltflib

    gltf = pygltflib.GLTF2().load(str(path))
    blob = gltf.binary_blob()
    data = []
    for accessor in gltf.accessors:
        view = gltf.bufferViews[accessor.bufferView]
        start = (view.byteOffset or 0) + (accessor.byteOffset or 0)
        dtype = np.dtype(COMPONENTS[accessor.componentType])
        width = {"SCALAR": 1, "VEC2": 2, "VEC3": 3, "VEC4": 4, "MAT4": 16}[accessor.type]
        data.append(np.frombuffer(blob, dtype, accessor.count * width, start).astype(float))
    document = json.loads(gltf.to_json())
    document.pop("buffers")
    return document, data


@pytest.mark.parametrize("named", ["a video", "a folder of videos"])
def test_motion_on_ray_writes_the_same_files_as_without(
    named, ray_session, clips, small_mirror, few_persons_yolo, tmp_path
):
    given = clips / "walk.mp4" if named == "a video" else clips
    setup = ["--checkpoint-dir", small_mirror, "--detector", few_persons_yolo, "--device", "cpu"]
    plain, scaled = tmp_path / "plain", tmp_path / "ray"
    # Float sums depend on how many threads share them: the plain run uses as many as a video's Ray task
    # (one CPU).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        status, printed = run_cli("pose", given, "--out", plain, "--motion", "--video-format", "mp4", *setup)
    finally:
        torch.set_num_threads(threads)
    assert status == EXIT_OK, printed
    status, printed = run_cli(
        "pose", given, "--out", scaled, "--motion", "--video-format", "mp4", "--ray", *setup
    )
    assert status == EXIT_OK, printed
    assert "with Ray" in printed and "Motion: " in printed
    names = _files(plain)
    assert names == _files(scaled), printed
    stems = ["walk"] if named == "a video" else ["walk", "more/again"]
    for stem in stems:
        assert f"{stem}_motion.glb" in names and f"{stem}_pose.mp4" in names
        bvh_files = sorted(
            name for name in names if name.startswith(f"{stem}_motion_") and name.endswith(".bvh")
        )
        assert bvh_files, names
        for name in bvh_files:
            (words, motion), (words_ray, motion_ray) = _bvh(plain / name), _bvh(scaled / name)
            _close(words, words_ray, name)
            assert motion.shape == motion_ray.shape
            np.testing.assert_allclose(motion_ray, motion, atol=TOLERANCE, rtol=0)
        (document, data), (document_ray, data_ray) = (
            _glb(plain / f"{stem}_motion.glb"),
            _glb(scaled / f"{stem}_motion.glb"),
        )
        _close(document, document_ray, "glb")
        for values, values_ray in zip(data, data_ray, strict=True):
            np.testing.assert_allclose(values_ray, values, atol=TOLERANCE, rtol=0)
        log = json.loads((plain / f"{stem}_predictions.json").read_text())
        log_ray = json.loads((scaled / f"{stem}_predictions.json").read_text())
        assert all(len(i["keypoints_3d"]) == 308 for frame in log["frames"] for i in frame["instances"])
        _close(log, log_ray, "predictions")
