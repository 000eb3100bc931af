"""The command line's arrays under a second torch build match this one's: every task on the example
photos with tiny random checkpoints, run by this Python and by the second one (`.ci/run` makes it: torch
2.8.0 / torchvision 0.23.0 on Python 3.10, what ZeroGPU's builder installs), compared file by file.

Both runs load the same checkpoints and detector in fp32 on the CPU; what may differ is torch's kernels.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
ASSETS = ROOT / "assets"
SECOND_PYTHON_ENV = "SAPIENS2_SECOND_PYTHON"
# Float arrays (normals, depth) and the numbers of JSON files: within 1e-4 of each other, relative to the
# array's largest magnitude (or one step of its dtype, fp16 normals), as two torch builds' fp32 kernels sum
# in different orders; JSON numbers also within their rounding (3 decimals).
RELATIVE = 1e-4
ROUNDING = 2e-3
# Per-pixel labels are an arg-max: where two random logits are nearly tied a reordered sum may flip the
# winner, so a few pixels in a thousand may differ.
LABEL_SHARE = 1e-3
# Keypoints of random tiny models sit on nearly flat heatmaps, where the sub-pixel refinement magnifies
# tiny differences and a near-tied arg-max may jump: 99% of them within 1 pixel, scores within 2e-4.
KEYPOINT_PIXELS, KEYPOINT_SHARE, SCORE = 1.0, 0.99, 2e-4
# Matting's alpha is written as an 8-bit PNG: one step of rounding either way.
ALPHA_STEPS = 1


def second_python() -> str:
    python = os.environ.get(SECOND_PYTHON_ENV)
    if not python:
        pytest.skip(f"{SECOND_PYTHON_ENV} names no second Python (.ci/run sets it to its torch 2.8 venv)")
    return python


def torch_version(python: str) -> str:
    done = subprocess.run(
        [python, "-c", "import sys, torch; print(torch.__version__, sys.version.split()[0])"],
        capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    return done.stdout.strip()


def numbers(value) -> list[float]:
    """Every number in a JSON value, in order."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return []
    if isinstance(value, int | float):
        return [float(value)]
    items = value.values() if isinstance(value, dict) else value
    return [number for item in items for number in numbers(item)]


def assert_close(mine: np.ndarray, theirs: np.ndarray, name: str) -> None:
    assert mine.shape == theirs.shape and mine.dtype == theirs.dtype, name
    if np.issubdtype(mine.dtype, np.integer) or mine.dtype == bool:
        share = float(np.mean(mine != theirs)) if mine.size else 0.0
        assert share <= LABEL_SHARE, f"{name}: {share:.2%} of the labels differ"
        return
    assert np.array_equal(np.isnan(mine), np.isnan(theirs)), f"{name}: not-a-number at other places"
    scale = max(float(np.nanmax(np.abs(mine))) if mine.size else 0.0, 1e-6)
    difference = float(np.nanmax(np.abs(mine - theirs))) if mine.size else 0.0
    allowed = max(RELATIVE, 2 * float(np.finfo(mine.dtype).eps)) * scale
    assert difference <= allowed, f"{name}: differs by {difference:.3g} (largest value {scale:.3g})"


def assert_same_numbers(mine: dict, theirs: dict, name: str) -> None:
    a, b = np.asarray(numbers(mine)), np.asarray(numbers(theirs))
    assert a.shape == b.shape, f"{name}: the files hold different things"
    off = np.abs(a - b) > RELATIVE * np.maximum(np.abs(a), np.abs(b)) + ROUNDING
    assert not off.any(), f"{name}: {a[off][:5]} became {b[off][:5]}"


def assert_same_poses(mine: dict, theirs: dict, name: str) -> None:
    persons = mine.pop("persons"), theirs.pop("persons")
    assert_same_numbers(mine, theirs, name)
    assert len(persons[0]) == len(persons[1]), f"{name}: {len(persons[0])} persons, then {len(persons[1])}"
    moved, count = 0, 0
    for person, other in zip(*persons, strict=True):
        assert_same_numbers(
            {"box": person["box_xywh"], "score": person["box_score"]},
            {"box": other["box_xywh"], "score": other["box_score"]},
            name,
        )
        for point, twin in zip(person["keypoints"], other["keypoints"], strict=True):
            assert point["name"] == twin["name"] and abs(point["score"] - twin["score"]) <= SCORE, name
            moved += max(abs(point["x"] - twin["x"]), abs(point["y"] - twin["y"])) > KEYPOINT_PIXELS
            count += 1
    assert moved <= (1 - KEYPOINT_SHARE) * count, f"{name}: {moved} of {count} keypoints moved"


def run_both(pythons: tuple[str, str], photos: Path, outs: tuple[Path, Path], checkpoints, detector) -> None:
    """Every task on `photos` under both Pythons at once (two processes), each into its own folder."""
    environment = {**os.environ, "HF_HUB_OFFLINE": "1", "YOLO_OFFLINE": "1"}
    runs = []
    for python, out in zip(pythons, outs, strict=True):
        command = [python, "-m", "sapiens2", "all", str(photos), "--out", str(out), "--exports", "npy,json"]
        command += ["--checkpoint-dir", str(checkpoints), "--detector", detector, "--device", "cpu"]
        command += ["--dtype", "fp32"]
        runs.append(
            subprocess.Popen(
                command,
                cwd=ROOT,
                env=environment,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    for python, run in zip(pythons, runs, strict=True):
        printed, _ = run.communicate(timeout=900)
        assert run.returncode == 0, f"{python}: {printed}"


@pytest.mark.slow
def test_every_tasks_arrays_match_under_the_second_torch(small_mirror, few_persons_yolo, tmp_path):
    second = second_python()
    pythons = sys.executable, second
    versions = torch_version(pythons[0]), torch_version(pythons[1])
    assert versions[0] != versions[1], f"both Pythons run torch {versions[0]}: nothing is compared"
    photos = tmp_path / "photos"
    photos.mkdir()
    shutil.copy(ASSETS / "astronaut.png", photos / "astronaut.png")
    outs = tmp_path / "mine", tmp_path / "second"
    run_both(pythons, photos, outs, small_mirror, few_persons_yolo)
    files = [sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()) for out in outs]
    assert files[0] == files[1], versions
    arrays = [name for name in files[0] if name.endswith(".npy")]
    tables = [name for name in files[0] if name.endswith(".json")]
    assert arrays and tables and any(name.endswith("_alpha.png") for name in files[0]), files[0]
    for name in files[0]:
        label = f"{name} ({versions[0]} / {versions[1]})"
        if name.endswith(".npy"):
            assert_close(*(np.load(out / name) for out in outs), label)
        elif name.endswith("_pose.json"):
            assert_same_poses(*(json.loads((out / name).read_text()) for out in outs), label)
        elif name.endswith(".json"):
            assert_same_numbers(*(json.loads((out / name).read_text()) for out in outs), label)
        elif name.endswith("_alpha.png"):
            mine, theirs = (np.asarray(Image.open(out / name), dtype=np.int16) for out in outs)
            assert np.abs(mine - theirs).max() <= ALPHA_STEPS, label
