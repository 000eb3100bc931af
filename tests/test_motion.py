"""Motion capture from a video, against a synthetic ground truth (tests/motion_scene.py): two people crossing,
one turning, elbows bent, projected with known intrinsics into keypoints and pointmaps.

The video goes through the real `process_video` (frame reader, pose tracking, the motion capture, the files)
with a stand-in model host: the models cannot be trained here to see the synthetic people, so the stand-in's
pose model answers the scene's projected keypoints (0.5 px of noise, a low score where the scene hides the
point) in the order of the persons from left to right, and its pointmap model answers the scene's rendered
pointmap. Everything after the models is the product's own code; the files are read back by independent
readers (bvhio, pygltflib)."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import os
import subprocess
from pathlib import Path

import cv2
import numpy as np
import pytest
from motion_scene import FPS, FRAMES, FY, HEIGHT, WIDTH, actors, project, render, visible

from sapiens2.batch.video import VideoJob, process_video
from sapiens2.data.metadata import keypoints308
from sapiens2.outputs.results import TaskResult
from sapiens2.pipelines.depth import DepthPrediction
from sapiens2.pipelines.pose import PosePrediction
from sapiens2.serving.motion_view import camera_orbit
from sapiens2.tasks.registry import get_task
from sapiens2.vision.detector import Detections
from sapiens2.vision.pose_decoding import Person
from sapiens2.vision.tracking import box_overlap

NAMES = keypoints308().names
INDEX = {name: i for i, name in enumerate(NAMES)}


@dataclasses.dataclass
class Scene:
    actors: list
    points: list  # per frame: each actor's keypoints {name: (3,)}
    pointmaps: list
    seen: list  # per frame: each actor's {name: bool}


def _scene() -> Scene:
    people = actors()
    points, pointmaps, seen = [], [], []
    for t in range(FRAMES):
        frame = [person.world(t) for person in people]
        pointmap = render([(p, person.scale) for p, person in zip(frame, people, strict=True)])
        points.append(frame)
        pointmaps.append(pointmap)
        seen.append([visible(p, pointmap) for p in frame])
    return Scene(people, points, pointmaps, seen)


class StandInRuntime:
    """The model host's part of `Runtime` that `process_video` uses, answering from the scene (see above)."""

    device, device_boundary, batch_size = "cpu", None, 4

    def __init__(self, scene: Scene) -> None:
        self.scene = scene
        self.calls = {"pose": 0, "depth": 0}
        self.prepared: list[str] = []
        self.rng = np.random.default_rng(0)

    def prepare(self, repo_id: str, progress=None) -> None:
        self.prepared.append(repo_id)

    def run_batch(
        self, task, images, *, size=None, model=None, progress=None, given=None, pictures=True, **options
    ):
        entry = get_task(task)
        options = entry.coerce_options(options)
        results = []
        for number, rgb in enumerate(images):
            t = self.calls[task]
            self.calls[task] += 1
            if task == "depth":
                pointmap = self.scene.pointmaps[t]
                foreground = np.ones(pointmap.shape[:2], dtype=bool)
                prediction = DepthPrediction(rgb, "stand-in", pointmap, foreground, None, 1.0, 1)
                results.append(TaskResult("depth", "stand-in", prediction, options))
            else:
                boxes = None if given is None or given[number] is None else given[number]["given_boxes"]
                results.append(self._pose(t, rgb, boxes, options))
        return results

    def _pose(self, t: int, rgb: np.ndarray, boxes, options) -> TaskResult:
        persons = []
        for points, seen in zip(self.scene.points[t], self.scene.seen[t], strict=True):
            keypoints = np.zeros((len(NAMES), 2))
            scores = np.zeros(len(NAMES))
            for name, point in points.items():
                keypoints[INDEX[name]] = project(point) + self.rng.normal(0, 0.5, 2)
                scores[INDEX[name]] = 0.9 if seen[name] else 0.1
            known = keypoints[scores > 0]
            low, high = known.min(axis=0) - 10, known.max(axis=0) + 10
            persons.append(Person(np.r_[low, high - low], keypoints, scores, 0.9))
        if boxes is None:  # the detector's order: left to right, whoever the person is
            persons.sort(key=lambda person: person.box[0])
        else:  # found inside the boxes given, in their order: the assignment that overlaps them best
            orders = itertools.permutations(range(len(persons)), len(boxes))
            given = boxes.boxes_xywh
            best = max(
                orders,
                key=lambda o: sum(box_overlap(persons[p].box, b) for p, b in zip(o, given, strict=True)),
            )
            persons = [persons[p] for p in best]
        boxes = np.array([p.box for p in persons], np.float32)
        found = Detections(boxes, np.full(len(persons), 0.9, np.float32), found=len(persons))
        prediction = PosePrediction(rgb, "stand-in", persons, found, NAMES, keypoints308())
        return TaskResult("pose", "stand-in", prediction, options, persons=len(prediction.detected))


def _write_video(path, pointmaps) -> None:
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), FPS, (WIDTH, HEIGHT))
    for pointmap in pointmaps:
        grey = np.clip(255 - pointmap[..., 2] * 30, 0, 255).astype(np.uint8)
        writer.write(cv2.cvtColor(grey, cv2.COLOR_GRAY2BGR))
    writer.release()


@pytest.fixture(scope="module")
def captured(tmp_path_factory):
    """The scene's video run with --motion: (scene, VideoResult, output folder)."""
    scene = _scene()
    folder = tmp_path_factory.mktemp("motion")
    clip = folder / "crossing.mp4"
    _write_video(clip, scene.pointmaps)
    job = VideoJob("pose", clip, folder, options={"motion": True}, video_format="mp4", write_view=True)
    runtime = StandInRuntime(scene)
    result = process_video(runtime, job)
    return scene, result, folder, runtime


def _bvh_positions(path) -> dict[str, np.ndarray]:
    """Every joint's world position (T, 3) as bvhio computes them from the file."""
    import bvhio

    root = bvhio.readAsHierarchy(str(path))
    joints = [joint for joint, _, _ in root.layout()]
    frames = len(root.Keyframes)
    out = {joint.Name: np.zeros((frames, 3)) for joint in joints}
    for t in range(frames):
        root.loadPose(t)
        for joint in joints:
            out[joint.Name][t] = np.array(joint.PositionWorld)
    return out


def _matched(scene: Scene, bvh: dict[str, np.ndarray]) -> int:
    """The scene actor whose hips follow the file's root most closely."""
    errors = [np.linalg.norm(bvh["Hips"] - _hips(scene, a), axis=1).mean() for a in range(len(scene.actors))]
    return int(np.argmin(errors))


def _hips(scene: Scene, actor: int) -> np.ndarray:
    return np.array([(p[actor]["left_hip"] + p[actor]["right_hip"]) / 2 for p in scene.points])


def _bend(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    first, second = b - a, c - b
    cosine = np.sum(first * second, -1) / np.linalg.norm(first, axis=-1) / np.linalg.norm(second, axis=-1)
    return np.degrees(np.arccos(np.clip(cosine, -1, 1)))


def test_files_and_ids_through_the_crossing(captured):
    scene, result, folder, runtime = captured
    names = sorted(path.name for path in result.motion_paths)
    assert names == ["crossing_motion.glb", "crossing_motion_1.bvh", "crossing_motion_2.bvh"]
    assert runtime.calls == {"pose": FRAMES, "depth": FRAMES}  # both models on every frame
    assert result.view_path is not None and result.view_path.exists()
    # Each file follows one person all along: with the ids swapped at the crossing its root would jump to the
    # other person (1.1 m behind) for the rest of the clip.
    matched = set()
    for path in sorted(folder.glob("crossing_motion_*.bvh")):
        bvh = _bvh_positions(path)
        actor = _matched(scene, bvh)
        matched.add(actor)
        error = np.linalg.norm(bvh["Hips"] - _hips(scene, actor), axis=1)
        assert error.max() < 0.02, f"{path.name}: root {error.max() * 100:.1f} cm off the ground truth"
    assert matched == {0, 1}


def test_bone_lengths_and_joint_angles(captured):
    scene, result, folder, _ = captured
    for path in sorted(folder.glob("crossing_motion_*.bvh")):
        bvh = _bvh_positions(path)
        actor = _matched(scene, bvh)
        gt, person = scene.points, scene.actors[actor]
        for side in ("Left", "Right"):
            low = side.lower()
            for joints, points in (
                (("Arm", "ForeArm"), ("shoulder", "elbow")),
                (("ForeArm", "Hand"), ("elbow", "wrist")),
                (("UpLeg", "Leg"), ("hip", "knee")),
                (("Leg", "Foot"), ("knee", "ankle")),
            ):
                length = np.linalg.norm(bvh[side + joints[1]] - bvh[side + joints[0]], axis=1)
                truth = np.linalg.norm(
                    gt[0][actor][f"{low}_{points[1]}"] - gt[0][actor][f"{low}_{points[0]}"]
                )
                assert np.ptp(length) < 1e-4  # fixed per person
                assert abs(length[0] / truth - 1) < 0.02, (
                    f"{side}{joints[1]}: {length[0]:.3f} m, truth {truth:.3f}"
                )
        for joints, points in (
            (("LeftArm", "LeftForeArm", "LeftHand"), ("left_shoulder", "left_elbow", "left_wrist")),
            (("LeftUpLeg", "LeftLeg", "LeftFoot"), ("left_hip", "left_knee", "left_ankle")),
            (("RightUpLeg", "RightLeg", "RightFoot"), ("right_hip", "right_knee", "right_ankle")),
        ):
            seen = np.array([all(scene.seen[t][actor][p] for p in points) for t in range(FRAMES)])
            estimated = _bend(*(bvh[j] for j in joints))
            truth = _bend(*(np.array([gt[t][actor][p] for t in range(FRAMES)]) for p in points))
            error = np.abs(estimated - truth)[seen]
            assert error.mean() < 5, f"{joints[1]}: {error.mean():.1f} degrees off on average"
        # The turn: the hips' left-right axis about Y.
        across = bvh["LeftUpLeg"] - bvh["RightUpLeg"]
        yaw = np.degrees(np.arctan2(-across[:, 2], across[:, 0]))
        assert np.abs(yaw - person.yaw()).max() < 5


def test_glb_animation_matches_the_bvh(captured):
    """pygltflib reads the GLB; its skeleton, posed by its own animation, stands where the BVH's does."""
    import pygltflib

    scene, result, folder, _ = captured
    gltf = pygltflib.GLTF2().load(str(folder / "crossing_motion.glb"))
    assert len(gltf.skins) == 2 and len(gltf.animations) == 1
    blob = gltf.binary_blob()

    def read(accessor_index: int) -> np.ndarray:
        accessor = gltf.accessors[accessor_index]
        view = gltf.bufferViews[accessor.bufferView]
        width = {"SCALAR": 1, "VEC3": 3, "VEC4": 4, "MAT4": 16}[accessor.type]
        dtype = {5126: "<f4", 5123: "<u2", 5125: "<u4"}[accessor.componentType]
        data = np.frombuffer(
            blob, dtype, accessor.count * width, view.byteOffset + (accessor.byteOffset or 0)
        )
        return data.reshape(accessor.count, width)

    animated: dict[tuple[int, str], np.ndarray] = {}
    for channel in gltf.animations[0].channels:
        sampler = gltf.animations[0].samplers[channel.sampler]
        animated[(channel.target.node, channel.target.path)] = read(sampler.output)
    assert read(gltf.animations[0].samplers[0].input)[1, 0] == pytest.approx(1 / FPS, rel=1e-5)

    def world(node: int, t: int, parent: np.ndarray, out: dict) -> None:
        n = gltf.nodes[node]
        matrix = np.eye(4)
        x, y, z, w = animated.get((node, "rotation"), [n.rotation or [0, 0, 0, 1]] * FRAMES)[t]
        matrix[:3, :3] = [
            [1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w)],
            [2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w)],
            [2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)],
        ]
        matrix[:3, 3] = animated.get((node, "translation"), [n.translation or [0, 0, 0]] * FRAMES)[t]
        matrix[:3, :3] *= animated.get((node, "scale"), [n.scale or [1, 1, 1]] * FRAMES)[t]
        placed = parent @ matrix
        out[n.name] = placed[:3, 3]
        for child in n.children or []:
            world(child, t, placed, out)

    for path in sorted(folder.glob("crossing_motion_*.bvh")):
        track = path.stem.rsplit("_", 1)[1]
        bvh = _bvh_positions(path)
        armature = next(i for i, n in enumerate(gltf.nodes) if n.name == f"person_{track}")
        for t in (0, FRAMES // 2, FRAMES - 1):
            out: dict = {}
            world(armature, t, np.eye(4), out)
            for name in ("Hips", "LeftHand", "RightFoot", "Head", "LeftHandIndex3"):
                assert np.allclose(out[f"{name}_{track}"], bvh[name][t], atol=1e-4), (name, t)


def test_the_glb_and_the_view_hold_the_camera_that_filmed_the_video(captured):
    """pygltflib reads the camera: at the origin, glTF's default orientation (looking down -Z, Y up, the
    motion's axes), with the scene's field of view and the frames' aspect."""
    import pygltflib

    _, result, folder, _ = captured
    for path in (folder / "crossing_motion.glb", result.view_path):
        gltf = pygltflib.GLTF2().load(str(path))
        (node,) = [node for node in gltf.nodes if node.camera is not None]
        assert node.camera == 0 and gltf.nodes.index(node) in gltf.scenes[0].nodes
        assert not node.translation and not node.rotation and not node.matrix
        (camera,) = gltf.cameras
        assert camera.type == "perspective"
        assert camera.perspective.yfov == pytest.approx(2 * math.atan(HEIGHT / 2 / FY), rel=1e-3)
        assert camera.perspective.aspectRatio == pytest.approx(WIDTH / HEIGHT)


def test_the_page_viewer_starts_at_the_filming_camera(captured):
    """The orbit given to the page's viewer puts it at the origin of the view file (the filming camera),
    turning about the middle of the first frame's bounds, which reach from the picture to the camera."""
    import pygltflib

    _, result, folder, _ = captured
    gltf = pygltflib.GLTF2().load(str(result.view_path))
    mesh = next(mesh for mesh in gltf.meshes if mesh.name == "first_frame")
    bounds = gltf.accessors[mesh.primitives[0].attributes.POSITION]
    middle = (np.array(bounds.min) + np.array(bounds.max)) / 2
    assert bounds.max[2] == 0 and bounds.min[2] < -4  # from the camera to the picture behind everyone
    alpha, beta, radius = camera_orbit(result.view_path)
    alpha, beta = math.radians(alpha), math.radians(beta)
    # Babylon.js's ArcRotateCamera, which Gradio's Model3D shows: middle + radius * (the orbit's direction).
    place = middle + radius * np.array(
        [np.cos(alpha) * np.sin(beta), np.cos(beta), np.sin(alpha) * np.sin(beta)]
    )
    assert np.abs(place).max() < 1e-5
    assert camera_orbit(folder / "crossing_motion.glb") is None  # no first frame in the motion file
    assert camera_orbit(folder / "crossing_motion_1.bvh") is None  # not a GLB


def test_frame_log_has_3d_keypoints(captured):
    scene, result, folder, _ = captured
    document = json.loads(result.log_path.read_text())
    frame = document["frames"][FRAMES // 2]
    assert {instance["track_id"] for instance in frame["instances"]} == {1, 2}
    for instance in frame["instances"]:
        hip = instance["keypoints_3d"][INDEX["left_hip"]]
        truths = [scene.points[FRAMES // 2][a]["left_hip"] for a in range(2)]
        assert min(np.linalg.norm(np.array(hip) - truth) for truth in truths) < 0.03


def test_motion_note(captured):
    """The user is told how many persons were captured and what the motion cost after the models."""
    scene, result, folder, _ = captured
    note = next(note for note in result.notes if note.startswith("Motion:"))
    assert "2 persons" in note and "ms per person and frame" in note


BLENDER_VENV = Path(os.environ.get("SAPIENS2_BLENDER_VENV", "/work/venvs/blender"))


def _blender_python() -> Path:
    """The Python of the venv holding Blender's `bpy` wheel (.ci/run makes it); skip when it is absent."""
    python = BLENDER_VENV / "bin" / "python"
    if not python.exists():
        pytest.skip(f"Blender's bpy is not installed: no {python} (.ci/run makes it; bpy needs Python 3.11)")
    probe = subprocess.run([str(python), "-c", "import bpy"], capture_output=True, text=True, timeout=300)
    if probe.returncode != 0:
        pytest.skip(f"Blender's bpy does not import in {BLENDER_VENV}: {probe.stderr.strip()[-300:]}")
    return python


def test_blender_opens_the_files(captured):
    """Blender itself imports every BVH and the GLB; its armatures' joints stand where the files put them
    (bvhio's reading of the BVH, which the tests above hold to the ground truth) within 1 cm, and the GLB's
    camera, as Blender imports it, sees each joint where the video's camera (the scene's own intrinsics)
    sees that joint, within a pixel: a render from it lays the skeletons over the video."""
    python = _blender_python()
    scene, result, folder, _ = captured
    frames = [0, FRAMES // 2, FRAMES - 1]
    files = [str(path) for path in sorted(result.motion_paths)]
    script = Path(__file__).with_name("blender_read.py")
    run = subprocess.run(
        [str(python), script, "--size", f"{WIDTH}x{HEIGHT}", str(FPS), ",".join(map(str, frames)), *files],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    read = json.loads(run.stdout.split("MOTION-JSON ", 1)[1].splitlines()[0])
    report, pixels = read["positions"], read["pixels"]
    glb = report[str(folder / "crossing_motion.glb")]
    assert list(pixels) == [str(folder / "crossing_motion.glb")]  # the one file with a camera
    for armature, bones in glb.items():
        for bone, places in bones.items():
            for frame, place in places.items():
                seen = pixels[str(folder / "crossing_motion.glb")][armature][bone][frame]
                assert np.linalg.norm(np.array(seen) - project(np.array(place))) < 1.0, (bone, frame)
    for path in sorted(folder.glob("crossing_motion_*.bvh")):
        track = path.stem.rsplit("_", 1)[1]
        expected = _bvh_positions(path)
        from_bvh = next(iter(report[str(path)].values()))
        from_glb = glb[f"person_{track}"]
        assert len(from_bvh) == len(expected) == len(from_glb)
        for name, positions in expected.items():
            for frame in frames:
                assert np.linalg.norm(np.array(from_bvh[name][str(frame)]) - positions[frame]) < 0.01, name
                placed = np.array(from_glb[f"{name}_{track}"][str(frame)])
                assert np.linalg.norm(placed - positions[frame]) < 0.01, (name, frame)


def test_motion_from_the_command_line(small_mirror, few_persons_yolo, tmp_path):
    """`sapiens2 pose FOLDER --motion` with tiny random checkpoints (their keypoints and depths are noise):
    every video gets its GLB and a BVH per person, and every file parses."""
    import bvhio
    import pygltflib
    from test_cli import run_cli
    from test_video import write_clip

    clips = tmp_path / "clips"
    clips.mkdir()
    for name in ("walk.mp4", "again.mp4"):
        write_clip(clips / name, count=3)
    out = tmp_path / "out"
    setup = ["--checkpoint-dir", small_mirror, "--detector", few_persons_yolo, "--device", "cpu"]
    status, printed = run_cli("pose", clips, "--out", out, "--motion", "--video-format", "mp4", *setup)
    assert status == 0, printed
    for stem in ("walk", "again"):
        gltf = pygltflib.GLTF2().load(str(out / f"{stem}_motion.glb"))
        bvh_files = sorted(out.glob(f"{stem}_motion_*.bvh"))
        assert len(gltf.skins or []) == len(bvh_files) >= 1
        for path in bvh_files:
            root = bvhio.readAsHierarchy(str(path))
            assert len(root.Keyframes) == 3 and len(root.layout()) == 50
        frames = json.loads((out / f"{stem}_predictions.json").read_text())["frames"]
        assert all(len(i["keypoints_3d"]) == 308 for frame in frames for i in frame["instances"])
    assert "Motion: " in printed
