"""Every person's motion in one binary glTF: a skinned skeleton each (joints as nodes, a mesh of thin
octahedra on the bones so any viewer shows it) and one animation that moves them all; the camera that filmed
them; optionally a picture (the video's first frame) standing behind them where the camera saw it."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import cv2
import numpy as np

from sapiens2.outputs.exports import _atomic_write, _target
from sapiens2.outputs.glb import ARRAY_BUFFER, ELEMENT_ARRAY_BUFFER, BufferBuilder, write_container
from sapiens2.vision.intrinsics import Intrinsics
from sapiens2.vision.motion_fit import Motion
from sapiens2.vision.rotations import normalized, quaternions

MOTION_GLB_SUFFIX = "_motion.glb"
# One colour per person, in the order of their ids (linear RGB).
PERSON_COLOURS = ((0.9, 0.35, 0.1), (0.1, 0.45, 0.9), (0.2, 0.75, 0.3), (0.85, 0.2, 0.6), (0.9, 0.75, 0.1))
BACKDROP_SIDE = 1024  # the picture's longer side in the file, at most
FIRST_FRAME = "first_frame"  # the name of the picture's node, mesh and material


@dataclass(frozen=True)
class Filmed:
    """The camera that filmed the motion, and its frames' size in pixels."""

    camera: Intrinsics
    width: int
    height: int


@dataclass(frozen=True)
class Backdrop:
    """A picture (H, W, 3 uint8 RGB) to stand where `camera` saw it, `distance` metres in front of it."""

    rgb: np.ndarray
    camera: Intrinsics
    distance: float


def rest_positions(motion: Motion) -> np.ndarray:
    """(J, 3) every joint's position in the rest pose, the root at the origin."""
    positions = np.zeros((len(motion.names), 3))
    for j, parent in enumerate(motion.parents):
        if parent >= 0:
            positions[j] = positions[parent] + motion.offsets[j]
    return positions


def _octahedra(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Flat-shaded octahedra, one from each start to each end (B, 3): positions and normals (B * 24, 3)."""
    axis = ends - starts
    length = np.linalg.norm(axis, axis=-1, keepdims=True)
    width = np.clip(0.12 * length, 0.006, 0.035)
    direction = normalized(axis)
    helper = np.where(np.abs(direction[:, 1:2]) < 0.9, [[0.0, 1.0, 0.0]], [[1.0, 0.0, 0.0]])
    u = normalized(np.cross(direction, helper))
    v = np.cross(direction, u)
    waist = starts + 0.2 * axis
    ring = [waist + width * u, waist + width * v, waist - width * u, waist - width * v]
    triangles = []
    for i in range(4):
        a, b = ring[i], ring[(i + 1) % 4]
        triangles += [(starts, b, a), (ends, a, b)]
    corners = np.stack([np.stack(t, axis=1) for t in triangles], axis=1)  # (B, 8, 3 corners, 3)
    normal = normalized(np.cross(corners[:, :, 1] - corners[:, :, 0], corners[:, :, 2] - corners[:, :, 0]))
    normals = np.repeat(normal[:, :, None], 3, axis=2)
    return corners.reshape(-1, 3), normals.reshape(-1, 3)


def _person(motion: Motion, number: int, buffer: BufferBuilder, document: dict, times: int) -> list[int]:
    """Adds one person's nodes, skin, mesh and material; returns the scene's nodes (armature, mesh) and
    appends the animation's channels and samplers."""
    nodes, animation = document["nodes"], document["animations"][0]
    moving = [j for j in range(len(motion.names)) if not motion.ends[j]]
    node_of = {j: len(nodes) + 1 + k for k, j in enumerate(moving)}
    armature = len(nodes)
    nodes.append({"name": f"person_{motion.track_id}", "children": [node_of[motion.parents.index(-1)]]})
    for j in moving:
        children = [node_of[c] for c, p in enumerate(motion.parents) if p == j and c in node_of]
        node = {"name": f"{motion.names[j]}_{motion.track_id}"}
        offset = motion.root[0] if motion.parents[j] < 0 else motion.offsets[j]
        node["translation"] = [float(v) for v in offset]
        if children:
            node["children"] = children
        nodes.append(node)
    rest = rest_positions(motion)
    inverse_bind = np.tile(np.eye(4, dtype=np.float32), (len(moving), 1, 1))
    inverse_bind[:, :3, 3] = -rest[moving]
    skin = {
        "joints": [node_of[j] for j in moving],
        "skeleton": node_of[motion.parents.index(-1)],
        # glTF's matrices are column-major: the transpose of numpy's rows.
        "inverseBindMatrices": buffer.accessor(np.swapaxes(inverse_bind, 1, 2).reshape(len(moving), 16)),
    }
    bones = [(p, j) for j, p in enumerate(motion.parents) if p >= 0]
    positions, normals = _octahedra(rest[[p for p, _ in bones]], rest[[j for _, j in bones]])
    joints = np.zeros((len(positions), 4), dtype="<u2")
    joints[:, 0] = np.repeat([moving.index(p) for p, _ in bones], 24)
    weights = np.zeros((len(positions), 4), dtype="<f4")
    weights[:, 0] = 1.0
    colour = PERSON_COLOURS[number % len(PERSON_COLOURS)]
    document["materials"].append(
        {
            "name": f"person_{motion.track_id}",
            "pbrMetallicRoughness": {
                "baseColorFactor": [*colour, 1.0],
                "metallicFactor": 0.0,
                "roughnessFactor": 0.7,
            },
        }
    )
    document["meshes"].append({"name": f"person_{motion.track_id}_bones", "primitives": [{
        "attributes": {
            "POSITION": buffer.accessor(positions.astype("<f4"), ARRAY_BUFFER, bounds=True),
            "NORMAL": buffer.accessor(normals.astype("<f4"), ARRAY_BUFFER),
            "JOINTS_0": buffer.accessor(joints, ARRAY_BUFFER),
            "WEIGHTS_0": buffer.accessor(weights, ARRAY_BUFFER),
        },
        "material": len(document["materials"]) - 1,
        "mode": 4,
    }]})  # fmt: skip
    document["skins"].append(skin)
    mesh_node = len(nodes)
    nodes.append(
        {
            "name": f"person_{motion.track_id}_mesh",
            "mesh": len(document["meshes"]) - 1,
            "skin": len(document["skins"]) - 1,
        }
    )
    root = node_of[motion.parents.index(-1)]
    _channel(animation, buffer, times, root, "translation", motion.root.astype("<f4"))
    rotations = quaternions(motion.local[:, moving]).astype("<f4")  # (T, joints, 4)
    for k, j in enumerate(moving):
        _channel(animation, buffer, times, node_of[j], "rotation", rotations[:, k])
    if not motion.seen.all():  # absent before it comes in and after it leaves: scaled to nothing
        present = np.zeros(len(motion.seen), dtype=bool)
        seen = np.flatnonzero(motion.seen)
        present[seen[0] : seen[-1] + 1] = True
        scale = np.where(present[:, None], 1.0, 0.0).astype("<f4").repeat(3, axis=1)
        _channel(animation, buffer, times, armature, "scale", scale, "STEP")
    return [armature, mesh_node]


def _channel(
    animation: dict,
    buffer: BufferBuilder,
    times: int,
    node: int,
    path: str,
    values: np.ndarray,
    interpolation: str = "LINEAR",
) -> None:
    animation["samplers"].append(
        {"input": times, "output": buffer.accessor(values), "interpolation": interpolation}
    )
    animation["channels"].append(
        {"sampler": len(animation["samplers"]) - 1, "target": {"node": node, "path": path}}
    )


def _backdrop(backdrop: Backdrop, buffer: BufferBuilder, document: dict) -> int:
    """Adds the picture on a quad where the camera saw it; returns its node."""
    height, width = backdrop.rgb.shape[:2]
    scale = min(1.0, BACKDROP_SIDE / max(height, width))
    small = cv2.resize(
        backdrop.rgb,
        (max(1, round(width * scale)), max(1, round(height * scale))),
        interpolation=cv2.INTER_AREA,
    )
    ok, encoded = cv2.imencode(".jpg", cv2.cvtColor(small, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_JPEG_QUALITY, 88])
    if not ok:
        raise ValueError("cannot encode the backdrop picture")
    camera, depth = backdrop.camera, backdrop.distance
    us, vs = np.array([-0.5, width - 0.5]), np.array([-0.5, height - 0.5])
    corners = [
        ((u - camera.cx) / camera.fx * depth, -(v - camera.cy) / camera.fy * depth, -depth)
        for v, u in ((vs[1], us[0]), (vs[1], us[1]), (vs[0], us[1]), (vs[0], us[0]))
    ]
    # A fifth vertex, in no triangle, at the camera: the picture's bounds then reach from the camera to the
    # picture, so a viewer that turns about the middle of the scene's bounds (the page's) can be placed at
    # the camera (`serving/motion_view.py`).
    positions = np.array([*corners, (0.0, 0.0, 0.0)], dtype="<f4")
    uvs = np.array([[0, 1], [1, 1], [1, 0], [0, 0], [0.5, 0.5]], dtype="<f4")
    faces = np.array([0, 1, 2, 0, 2, 3], dtype="<u4")
    document["images"] = [{"bufferView": buffer.view(encoded.tobytes()), "mimeType": "image/jpeg"}]
    document["textures"] = [{"source": 0}]
    document["materials"].append(
        {
            "name": FIRST_FRAME,
            "pbrMetallicRoughness": {"baseColorTexture": {"index": 0}, "metallicFactor": 0.0},
            "extensions": {"KHR_materials_unlit": {}},
            "doubleSided": True,
        }
    )
    document["extensionsUsed"] = ["KHR_materials_unlit"]
    document["meshes"].append({"name": FIRST_FRAME, "primitives": [{
        "attributes": {"POSITION": buffer.accessor(positions, ARRAY_BUFFER, bounds=True),
                       "TEXCOORD_0": buffer.accessor(uvs, ARRAY_BUFFER)},
        "indices": buffer.accessor(faces, ELEMENT_ARRAY_BUFFER),
        "material": len(document["materials"]) - 1,
    }]})  # fmt: skip
    document["nodes"].append({"name": FIRST_FRAME, "mesh": len(document["meshes"]) - 1})
    return len(document["nodes"]) - 1


def _camera(filmed: Filmed, document: dict) -> int:
    """Adds the camera that filmed the motion at the origin, looking down -Z with Y up (glTF's own camera
    axes, which are the motion's); returns its node. glTF's camera has its principal point at the centre of
    the picture, so one fitted off the centre shifts the view by the difference."""
    document["cameras"] = [{
        "name": "camera",
        "type": "perspective",
        "perspective": {
            "yfov": 2 * math.atan(filmed.height / 2 / filmed.camera.fy),
            "aspectRatio": filmed.width / filmed.height,
            "znear": 0.01,
        },
    }]  # fmt: skip
    document["nodes"].append({"name": "camera", "camera": 0})
    return len(document["nodes"]) - 1


def write_motion_glb(
    file: BinaryIO,
    motions: list[Motion],
    fps: float,
    filmed: Filmed | None = None,
    backdrop: Backdrop | None = None,
) -> None:
    """One GLB of every person's skeleton and one animation "motion" of them all at `fps`, with the camera
    that `filmed` them."""
    document: dict = {
        "asset": {"version": "2.0", "generator": "Sapiens2 Studio"},
        "scene": 0,
        "scenes": [{"name": "motion", "nodes": []}],
        "nodes": [],
        "meshes": [],
        "materials": [],
        "skins": [],
        "animations": [{"name": "motion", "channels": [], "samplers": []}],
    }
    buffer = BufferBuilder()
    scene = document["scenes"][0]["nodes"]
    frames = max((motion.frames for motion in motions), default=0)
    if frames:
        times = buffer.accessor((np.arange(frames) / fps).astype("<f4"), bounds=True)
        for number, motion in enumerate(motions):
            scene += _person(motion, number, buffer, document, times)
    if filmed is not None:
        scene.append(_camera(filmed, document))
    if backdrop is not None:
        scene.append(_backdrop(backdrop, buffer, document))
    for key in ("meshes", "materials", "skins"):
        if not document[key]:
            del document[key]
    if not document["animations"][0]["channels"]:
        del document["animations"]
    write_container(file, document, buffer.into(document))


def write_motion(
    directory: str | os.PathLike,
    stem: str,
    motions: list[Motion],
    fps: float,
    filmed: Filmed | None = None,
    backdrop: Backdrop | None = None,
    suffix: str = MOTION_GLB_SUFFIX,
) -> list[Path]:
    """`{stem}_motion.glb`: every person's skeleton and their animation, and the camera."""
    target = _target(directory, stem, suffix)
    return [_atomic_write(target, lambda file: write_motion_glb(file, motions, fps, filmed, backdrop))]
