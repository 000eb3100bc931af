"""Tiny training datasets in the documented layouts, drawn with known labels, for the training tests.

Each photo shows one "person": shapes whose labels are known exactly (class masks, keypoints at drawn dots,
a sphere's normals and depth seen by a known camera, a soft disk's alpha over a known background).
"""

from __future__ import annotations

import json
from pathlib import Path

import cv2
import numpy as np

POSE_NAMES = ("nose", "left_hand", "right_hand", "left_foot", "right_foot")
CLASS_NAMES = ("background", "torso", "left_arm", "right_arm")


def _write_rgb(path: Path, rgb: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    cv2.imwrite(str(path), cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR))


def _background(rng: np.random.Generator, size: tuple[int, int]) -> np.ndarray:
    return rng.integers(0, 60, (*size, 3), dtype=np.uint8)


def write_pose(directory: Path, count: int = 4, size: tuple[int, int] = (64, 56), seed: int = 0) -> Path:
    """annotations.json with one person per photo: 5 named keypoints drawn as coloured dots in its box."""
    rng = np.random.default_rng(seed)
    colours = [(255, 255, 255), (255, 0, 0), (0, 255, 0), (0, 0, 255), (255, 255, 0)]
    images, annotations = [], []
    for index in range(count):
        rgb = _background(rng, size)
        x0, y0 = rng.uniform(6, 14), rng.uniform(4, 10)
        w, h = size[1] - 2 * x0 + rng.uniform(-3, 3), size[0] - 2 * y0
        points = np.array([[0.5, 0.1], [0.15, 0.45], [0.85, 0.45], [0.3, 0.9], [0.7, 0.9]]) * [w, h] + [
            x0,
            y0,
        ]
        points += rng.uniform(-2, 2, points.shape)
        for point, colour in zip(points, colours, strict=True):
            cv2.circle(rgb, (round(point[0]), round(point[1])), 2, colour, -1)
        name = f"person_{index}.png"
        _write_rgb(directory / "images" / name, rgb)
        images.append({"id": index, "file_name": name, "height": size[0], "width": size[1]})
        visible = [2, 2, 2, 2, 1 if index % 2 else 0]
        keypoints = [v for point, flag in zip(points, visible, strict=True) for v in (*point.tolist(), flag)]
        annotations.append({"id": index, "image_id": index, "bbox": [x0, y0, w, h], "keypoints": keypoints})
    category = {
        "id": 1,
        "name": "person",
        "keypoints": list(POSE_NAMES),
        "skeleton": [[1, 2], [1, 3], [1, 4], [1, 5]],
    }
    data = {"images": images, "annotations": annotations, "categories": [category]}
    (directory / "annotations.json").write_text(json.dumps(data))
    return directory


def write_segmentation(
    directory: Path, count: int = 4, size: tuple[int, int] = (60, 44), seed: int = 0, classes: bool = True
) -> Path:
    """Photos of a torso with a left and a right arm, each class its own colour; classes.json optional."""
    rng = np.random.default_rng(seed)
    colours = {1: (200, 40, 40), 2: (40, 200, 40), 3: (40, 40, 220)}
    for index in range(count):
        rgb = _background(rng, size)
        labels = np.zeros(size, np.uint8)
        top, left = int(rng.integers(4, 12)), int(rng.integers(12, 18))
        height, width = size[0] - top - int(rng.integers(4, 10)), int(rng.integers(10, 14))
        boxes = {
            1: (top, left, top + height, left + width),
            # The person's left arm is on the photo's right, as in a photo of someone facing the camera.
            2: (top + 4, left + width, top + height // 2, min(size[1] - 2, left + width + 8)),
            3: (top + 4, max(2, left - 8), top + height // 2, left),
        }
        for label, (y0, x0, y1, x1) in boxes.items():
            labels[y0:y1, x0:x1] = label
            rgb[y0:y1, x0:x1] = colours[label]
        labels[top, :] = 255  # one unlabelled row
        _write_rgb(directory / "images" / f"photo_{index}.png", rgb)
        (directory / "masks").mkdir(parents=True, exist_ok=True)
        cv2.imwrite(str(directory / "masks" / f"photo_{index}.png"), labels)
    if classes:
        palette = [[0, 0, 0], *[list(colour) for colour in colours.values()]]
        (directory / "classes.json").write_text(json.dumps({"names": list(CLASS_NAMES), "palette": palette}))
    return directory


def sphere(
    size: tuple[int, int], centre: tuple[float, float], radius: float
) -> tuple[np.ndarray, np.ndarray]:
    """Unit normals (H, W, 3) of a sphere seen from the front (x right, y down, z towards the camera) and
    its mask (H, W)."""
    rows, columns = np.indices(size, dtype=np.float32)
    x, y = (columns - centre[0]) / radius, (rows - centre[1]) / radius
    inside = x**2 + y**2 < 1
    z = np.sqrt(np.clip(1 - x**2 - y**2, 0, 1))
    return np.stack([x, y, z], axis=-1) * inside[..., None], inside


def write_normals(directory: Path, count: int = 4, size: tuple[int, int] = (48, 40), seed: int = 0) -> Path:
    """Shaded spheres with their normals (.npy) and masks."""
    rng = np.random.default_rng(seed)
    for index in range(count):
        centre = (rng.uniform(15, 25), rng.uniform(18, 30))
        normals, inside = sphere(size, centre, rng.uniform(10, 14))
        rgb = _background(rng, size)
        rgb[inside] = np.clip((normals[inside] * 0.5 + 0.5) * 255, 0, 255).astype(np.uint8)
        _write_rgb(directory / "images" / f"photo_{index}.png", rgb)
        (directory / "normals").mkdir(parents=True, exist_ok=True)
        np.save(directory / "normals" / f"photo_{index}.npy", normals.astype(np.float32))
        (directory / "masks").mkdir(parents=True, exist_ok=True)
        cv2.imwrite(str(directory / "masks" / f"photo_{index}.png"), inside.astype(np.uint8) * 255)
    return directory


def write_pointmaps(
    directory: Path, count: int = 4, size: tuple[int, int] = (48, 40), seed: int = 0, intrinsics: bool = False
) -> Path:
    """Spheres in front of a camera: camera-space XYZ pointmaps (0 off the sphere), photos shaded by depth."""
    rng = np.random.default_rng(seed)
    for index in range(count):
        fx = rng.uniform(700, 840)  # near the canonical focal length: focal scales near 1
        camera = np.array([[fx, 0, size[1] / 2 - 0.5], [0, fx * 1.02, size[0] / 2 - 0.5], [0, 0, 1]])
        normals, inside = sphere(size, (rng.uniform(16, 24), rng.uniform(20, 28)), rng.uniform(11, 14))
        depth = np.where(inside, 3.0 - 0.5 * normals[..., 2] + 0.1 * index, 0).astype(np.float32)
        rows, columns = np.indices(size, dtype=np.float32)
        x = (columns - camera[0, 2]) * depth / camera[0, 0]
        y = (rows - camera[1, 2]) * depth / camera[1, 1]
        rgb = _background(rng, size)
        rgb[inside] = np.clip(255 * (3.5 - depth[inside]), 0, 255)[:, None].astype(np.uint8)
        _write_rgb(directory / "images" / f"photo_{index}.png", rgb)
        (directory / "pointmaps").mkdir(parents=True, exist_ok=True)
        np.save(
            directory / "pointmaps" / f"photo_{index}.npy",
            np.stack([x, y, depth], axis=-1).astype(np.float32),
        )
        if intrinsics:
            (directory / "intrinsics").mkdir(parents=True, exist_ok=True)
            values = {"fx": camera[0, 0], "fy": camera[1, 1], "cx": camera[0, 2], "cy": camera[1, 2]}
            (directory / "intrinsics" / f"photo_{index}.json").write_text(json.dumps(values))
    return directory


def write_matting(directory: Path, count: int = 4, size: tuple[int, int] = (48, 40), seed: int = 0) -> Path:
    """A soft-edged disk of one colour over a noisy background, with its alpha matte."""
    rng = np.random.default_rng(seed)
    for index in range(count):
        rows, columns = np.indices(size, dtype=np.float32)
        distance = np.hypot(columns - rng.uniform(15, 25), rows - rng.uniform(18, 30))
        alpha = np.clip((rng.uniform(11, 15) - distance) / 3, 0, 1)
        colour = np.array([230, 180, 140], dtype=np.float32)
        rgb = (alpha[..., None] * colour + (1 - alpha[..., None]) * _background(rng, size)).astype(np.uint8)
        _write_rgb(directory / "images" / f"photo_{index}.png", rgb)
        (directory / "alphas").mkdir(parents=True, exist_ok=True)
        cv2.imwrite(str(directory / "alphas" / f"photo_{index}.png"), np.round(alpha * 255).astype(np.uint8))
    return directory


WRITERS = {
    "pose": write_pose,
    "segment": write_segmentation,
    "normals": write_normals,
    "depth": write_pointmaps,
    "matting": write_matting,
}
