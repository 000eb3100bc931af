"""Motion capture after the models: its accuracy on the synthetic crossing (tests/motion_scene.py) and its
cost per person and frame (CPU time of the thread doing it, and wall time), against the budget of 20 ms.

The scene's keypoints (0.5 px of noise; occluded ones scored low) and pointmaps go straight into the
`MotionRecorder`, as a video run hands them over; the figures are the fitted skeleton's against the ground
truth: bone lengths, the elbow and knee bends where the joint is seen, the hips' turn and path. The cost
is the recorder's own time (lifting every frame, fitting at the end) over the person-frames, at 640x480
and at 1920x1080 (the same scene with the pointmap enlarged: lifting reads a window around each keypoint,
so only the camera fit grows with the frame).

    python bench/bench_motion.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import cv2
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import motion_scene as scene  # noqa: E402

from sapiens2.data.metadata import keypoints308  # noqa: E402
from sapiens2.outputs.motion_capture import MotionRecorder  # noqa: E402

BUDGET_MS = 20.0


def frames(scale: float) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Per frame: keypoints (2, 308, 2), scores (2, 308) and the pointmap, enlarged by `scale`."""
    names = keypoints308().names
    index = {name: i for i, name in enumerate(names)}
    rng = np.random.default_rng(0)
    people = scene.actors()
    out = []
    for t in range(scene.FRAMES):
        points = [person.world(t) for person in people]
        pointmap = scene.render([(p, person.scale) for p, person in zip(points, people, strict=True)])
        keypoints, scores = np.zeros((2, len(names), 2)), np.zeros((2, len(names)))
        for i, p in enumerate(points):
            seen = scene.visible(p, pointmap)
            for name, point in p.items():
                keypoints[i, index[name]] = scene.project(point) + rng.normal(0, 0.5, 2)
                scores[i, index[name]] = 0.9 if seen[name] else 0.1
        if scale != 1:
            size = (round(scene.WIDTH * scale), round(scene.HEIGHT * scale))
            pointmap = cv2.resize(pointmap, size, interpolation=cv2.INTER_NEAREST)
            keypoints = keypoints * scale
        out.append((keypoints, scores, pointmap))
    return out


def run(recorded) -> MotionRecorder:
    recorder = MotionRecorder(keypoints308().names, scene.FPS, 0.3)
    for keypoints, scores, pointmap in recorded:
        recorder.add(keypoints, scores, np.array([1, 2]), pointmap)
    recorder.motions()
    return recorder


def accuracy(recorder: MotionRecorder) -> None:
    people = scene.actors()
    for motion, person in zip(recorder.motions(), people, strict=True):
        positions, rotations = motion.world()
        joint = {name: i for i, name in enumerate(motion.names)}
        truth = [person.world(t) for t in range(scene.FRAMES)]
        hips = np.array([(p["left_hip"] + p["right_hip"]) / 2 for p in truth])
        root = np.linalg.norm(motion.root - hips, axis=1)
        lengths = []
        for side in ("Left", "Right"):
            for child, a, b in (("ForeArm", "shoulder", "elbow"), ("Hand", "elbow", "wrist"),
                                ("Leg", "hip", "knee"), ("Foot", "knee", "ankle")):  # fmt: skip
                real = np.linalg.norm(truth[0][f"{side.lower()}_{b}"] - truth[0][f"{side.lower()}_{a}"])
                lengths.append(abs(np.linalg.norm(motion.offsets[joint[side + child]]) / real - 1) * 100)
        path = f"root path mean {root.mean() * 100:.2f} cm, max {root.max() * 100:.2f} cm"
        bones = f"bone lengths mean {np.mean(lengths):.2f} %, max {np.max(lengths):.2f} %"
        print(f"person {motion.track_id}: {path}; {bones}")
        for label, joints, points in (
            (
                "left elbow",
                ("LeftArm", "LeftForeArm", "LeftHand"),
                ("left_shoulder", "left_elbow", "left_wrist"),
            ),
            ("left knee", ("LeftUpLeg", "LeftLeg", "LeftFoot"), ("left_hip", "left_knee", "left_ankle")),
        ):
            estimated = _bend(*(positions[:, joint[j]] for j in joints))
            real = _bend(*(np.array([p[name] for p in truth]) for name in points))
            error = np.abs(estimated - real)
            spread = f"median {np.median(error):.1f}, max {error.max():.1f}"
            print(f"  {label}: mean {error.mean():.1f} degrees, {spread}")
        across = rotations[:, 0] @ np.array([1.0, 0.0, 0.0])
        yaw = np.degrees(np.arctan2(-across[:, 2], across[:, 0]))
        print(f"  hips' turn: max error {np.abs(yaw - person.yaw()).max():.1f} degrees")


def _bend(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    first, second = b - a, c - b
    cosine = np.sum(first * second, -1) / np.linalg.norm(first, axis=-1) / np.linalg.norm(second, axis=-1)
    return np.degrees(np.arccos(np.clip(cosine, -1, 1)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    small = frames(1.0)
    accuracy(run(small))
    for label, recorded in (("640x480", small), ("1920x1080", frames(3.0))):
        costs, walls = [], []
        for _ in range(args.repeats):
            start = time.perf_counter()
            costs.append(run(recorded).ms_per_person_frame)
            walls.append(1000 * (time.perf_counter() - start) / (2 * len(recorded)))
        cost, wall = statistics.median(costs), statistics.median(walls)
        share = f"{cost / BUDGET_MS:.2f} of the {BUDGET_MS:.0f} ms budget; median of {args.repeats}"
        print(f"{label}: {cost:.2f} CPU ms per person and frame after the models ({share}), wall {wall:.2f}")


if __name__ == "__main__":
    main()
