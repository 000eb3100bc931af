"""Training augmentations, after the official 1024x768 recipes, each drawing from the generator it is given.

Pose: person crops through the UDP affine warp with a random shift (p 0.3, 0.16 of the box), scale (0.5 to
1.5) and rotation (p 0.6, up to 80 degrees), a horizontal flip (p 0.5) that swaps the flip pairs, colour
jitter (p 0.8). Segmentation: random scale (0.4 to 2 of the fitted size), crop (p 0.3), rotation (p 0.5, up
to 60 degrees, new pixels background), flip (p 0.5) with left / right classes swapped, colour jitter, blur
and noise (p 0.3 each). Normals and depth: colour jitter, random scale (p 0.3, 0.5 to 2) and crop (p 0.3,
aspect 0.5 to 2, area 0.4 to 1), flip (p 0.3; normals' x negated, the camera mirrored), then normals add
blur, noise and solarization (p 0.3 each). Matting: scale, crop and flip only, so the photo's colours keep
matching its foreground (the official config also compresses to JPEG, rotates and distorts colours). Left
out: the half-body crop, the albumentations blur and dropout of pose, and the down-up sampling of normals.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import cv2
import numpy as np

# Maps resized with nearest neighbours (labels, masks, normals, depth); the others bilinearly.
NEAREST_MAPS = frozenset({"classes", "mask", "normals", "depth"})


def truncated_normal(rng: np.random.Generator, size: int | tuple[int, ...] = ()) -> np.ndarray:
    """Standard normal draws kept within [-1, 1] (redrawn until they are)."""
    values = rng.standard_normal(size)
    while np.any(np.abs(values) > 1):
        outside = np.abs(values) > 1
        values = np.where(outside, rng.standard_normal(np.shape(values)), values)
    return values


# ---- colour ---------------------------------------------------------------------------------------------


def colour_jitter(rng: np.random.Generator, image: np.ndarray) -> np.ndarray:
    """The official photometric distortion of an RGB uint8 image: brightness +-32, contrast 0.5 to 1.5
    (before or after the rest), saturation 0.5 to 1.5 and hue +-18 (of 180), each with probability 0.5."""
    image = image.astype(np.float32)
    if rng.random() < 0.5:
        image = np.clip(image + rng.uniform(-32, 32), 0, 255)
    contrast_first = rng.random() < 0.5
    if contrast_first and rng.random() < 0.5:
        image = np.clip(image * rng.uniform(0.5, 1.5), 0, 255)
    saturate, hue = rng.random() < 0.5, rng.random() < 0.5
    if saturate or hue:
        hsv = cv2.cvtColor(image.astype(np.uint8), cv2.COLOR_RGB2HSV).astype(np.float32)
        if saturate:
            hsv[..., 1] = np.clip(hsv[..., 1] * rng.uniform(0.5, 1.5), 0, 255)
        if hue:
            hsv[..., 0] = (hsv[..., 0] + rng.integers(-18, 19)) % 180
        image = cv2.cvtColor(hsv.astype(np.uint8), cv2.COLOR_HSV2RGB).astype(np.float32)
    if not contrast_first and rng.random() < 0.5:
        image = np.clip(image * rng.uniform(0.5, 1.5), 0, 255)
    return image.astype(np.uint8)


def blur_and_noise(rng: np.random.Generator, image: np.ndarray, solarize: bool = False) -> np.ndarray:
    """Gaussian blur (3x3, sigma 0.1 to 2), Gaussian noise (variance 5 to 20) and, optionally, solarization
    (values from 128 inverted), each with probability 0.3."""
    if rng.random() < 0.3:
        image = cv2.GaussianBlur(image, (3, 3), rng.uniform(0.1, 2.0))
    if rng.random() < 0.3:
        noise = rng.normal(0.0, math.sqrt(rng.uniform(5.0, 20.0)), image.shape)
        image = np.clip(image.astype(np.float32) + noise, 0, 255).astype(np.uint8)
    if solarize and rng.random() < 0.3:
        image = np.where(image >= 128, 255 - image, image).astype(np.uint8)
    return image


# ---- pose: person crops ---------------------------------------------------------------------------------


def udp_warp_matrix(
    center: np.ndarray, size: np.ndarray, rotation: float, output_size: tuple[int, int]
) -> np.ndarray:
    """The 2x3 affine map from photo pixels to crop pixels of a window (center x, y; size w, h) rotated by
    `rotation` degrees, onto an (height, width) crop; pixel centres map to pixel centres (UDP)."""
    height, width = output_size
    scale = np.array([(width - 1) / size[0], (height - 1) / size[1]])
    angle = math.radians(rotation)
    rotate = np.array([[math.cos(angle), -math.sin(angle)], [math.sin(angle), math.cos(angle)]])
    linear = scale[:, None] * rotate
    offset = np.array([(width - 1) / 2, (height - 1) / 2]) - linear @ center
    return np.concatenate([linear, offset[:, None]], axis=1)


def random_person_window(
    rng: np.random.Generator, center: np.ndarray, size: np.ndarray
) -> tuple[np.ndarray, np.ndarray, float]:
    """The official random box transform: shift (p 0.3) by up to 0.16 of the size, scale by 0.5 to 1.5,
    rotate (p 0.6) by up to 80 degrees; truncated normal draws."""
    shift = truncated_normal(rng, 2) * 0.16
    center = center + (shift * size if rng.random() < 0.3 else 0)
    size = size * (truncated_normal(rng) * 0.5 + 1.0)
    rotation = float(truncated_normal(rng) * 80.0) if rng.random() < 0.6 else 0.0
    return center, size, rotation


def warp_person(image: np.ndarray, matrix: np.ndarray, output_size: tuple[int, int]) -> np.ndarray:
    """The crop (height, width, 3) of `matrix`, bilinear when it shrinks and bicubic when it enlarges,
    black outside the photo."""
    enlarges = min(np.linalg.norm(matrix[0, :2]), np.linalg.norm(matrix[1, :2])) >= 1.0
    flags = cv2.INTER_CUBIC if enlarges else cv2.INTER_LINEAR
    size = (output_size[1], output_size[0])
    return cv2.warpAffine(image, matrix, size, flags=flags, borderMode=cv2.BORDER_CONSTANT, borderValue=0)


def transform_points(points: np.ndarray, matrix: np.ndarray) -> np.ndarray:
    """Points (K, 2) through a 2x3 affine map."""
    return points @ matrix[:, :2].T + matrix[:, 2]


def flip_order(count: int, pairs: Sequence[tuple[int, int]]) -> np.ndarray:
    """The index permutation (count,) that swaps each pair: channel i of a mirrored sample is channel
    order[i] of the original."""
    order = np.arange(count)
    for left, right in pairs:
        order[left], order[right] = right, left
    return order


def flip_keypoints(
    keypoints: np.ndarray, visible: np.ndarray, width: int, pairs: Sequence[tuple[int, int]]
) -> tuple[np.ndarray, np.ndarray]:
    """Keypoints (K, 2) and visibility (K,) of the crop mirrored left to right: x -> width - 1 - x, and the
    left and right keypoints of each pair exchanged."""
    order = flip_order(len(keypoints), pairs)
    mirrored = keypoints[order].copy()
    mirrored[:, 0] = width - 1 - mirrored[:, 0]
    return mirrored, visible[order].copy()


# ---- dense tasks ----------------------------------------------------------------------------------------


@dataclass
class DenseSample:
    """A photo (H, W, 3) uint8 with its maps by kind (classes, mask, normals, depth, alpha, foreground),
    each (H, W) or (H, W, C), and the pinhole camera (3, 3) of depth samples."""

    image: np.ndarray
    maps: dict[str, np.ndarray] = field(default_factory=dict)
    camera: np.ndarray | None = None

    @property
    def size(self) -> tuple[int, int]:
        return self.image.shape[0], self.image.shape[1]


def resize(sample: DenseSample, size: tuple[int, int]) -> DenseSample:
    """The sample at (height, width); the camera follows (pixel centres stay pixel centres)."""
    height, width = size
    if (height, width) == sample.size:
        return sample
    shrink = height < sample.size[0]
    image = cv2.resize(
        sample.image, (width, height), interpolation=cv2.INTER_AREA if shrink else cv2.INTER_LINEAR
    )
    maps = {
        kind: cv2.resize(values, (width, height), interpolation=_interpolation(kind))
        for kind, values in sample.maps.items()
    }
    camera = None
    if sample.camera is not None:
        sx, sy = width / sample.size[1], height / sample.size[0]
        camera = sample.camera.copy()
        camera[0, 0], camera[1, 1] = camera[0, 0] * sx, camera[1, 1] * sy
        camera[0, 2], camera[1, 2] = (camera[0, 2] + 0.5) * sx - 0.5, (camera[1, 2] + 0.5) * sy - 0.5
    return DenseSample(image, maps, camera)


def crop(sample: DenseSample, top: int, left: int, height: int, width: int) -> DenseSample:
    """The window of the sample at (top, left) of (height, width); the camera's centre moves with it."""
    window = (slice(top, top + height), slice(left, left + width))
    camera = None if sample.camera is None else sample.camera.copy()
    if camera is not None:
        camera[0, 2], camera[1, 2] = camera[0, 2] - left, camera[1, 2] - top
    maps = {kind: values[window].copy() for kind, values in sample.maps.items()}
    return DenseSample(sample.image[window].copy(), maps, camera)


def pad(sample: DenseSample, top: int, left: int, size: tuple[int, int]) -> DenseSample:
    """The sample placed at (top, left) of a black (height, width) canvas; maps 0 outside it."""

    def place(values: np.ndarray) -> np.ndarray:
        canvas = np.zeros((*size, *values.shape[2:]), dtype=values.dtype)
        canvas[top : top + values.shape[0], left : left + values.shape[1]] = values
        return canvas

    camera = None if sample.camera is None else sample.camera.copy()
    if camera is not None:
        camera[0, 2], camera[1, 2] = camera[0, 2] + left, camera[1, 2] + top
    return DenseSample(place(sample.image), {kind: place(v) for kind, v in sample.maps.items()}, camera)


def flip(sample: DenseSample, class_order: np.ndarray | None = None) -> DenseSample:
    """The sample mirrored left to right: classes renamed through `class_order` (left <-> right), normals'
    x negated, the camera's centre mirrored."""
    maps = {kind: values[:, ::-1].copy() for kind, values in sample.maps.items()}
    if "classes" in maps and class_order is not None:
        lookup = np.arange(256, dtype=np.uint8)
        lookup[: len(class_order)] = class_order
        maps["classes"] = lookup[maps["classes"]]
    if "normals" in maps:
        maps["normals"][..., 0] *= -1
    camera = None if sample.camera is None else sample.camera.copy()
    if camera is not None:
        camera[0, 2] = sample.size[1] - 1 - camera[0, 2]
    return DenseSample(sample.image[:, ::-1].copy(), maps, camera)


def rotate(sample: DenseSample, degrees: float) -> DenseSample:
    """The sample rotated about its centre, new pixels black and class 0 (no camera: not for depth)."""
    height, width = sample.size
    matrix = cv2.getRotationMatrix2D(((width - 1) / 2, (height - 1) / 2), degrees, 1.0)

    def turn(values: np.ndarray, interpolation: int) -> np.ndarray:
        return cv2.warpAffine(values, matrix, (width, height), flags=interpolation, borderValue=0)

    maps = {kind: turn(values, _interpolation(kind)) for kind, values in sample.maps.items()}
    return replace(sample, image=turn(sample.image, cv2.INTER_LINEAR), maps=maps)


def random_scale(rng: np.random.Generator, sample: DenseSample, low: float, high: float) -> DenseSample:
    """The sample resized by a uniform factor in [low, high]."""
    factor = rng.uniform(low, high)
    height, width = sample.size
    return resize(sample, (max(1, round(height * factor)), max(1, round(width * factor))))


def random_crop(rng: np.random.Generator, sample: DenseSample, attempts: int = 8) -> DenseSample:
    """A window of aspect ratio 0.5 to 2 and 0.4 to 1 of the area that fits the sample (the sample itself
    when no draw fits)."""
    height, width = sample.size
    for _ in range(attempts):
        aspect, area = rng.uniform(0.5, 2.0), rng.uniform(0.4, 1.0) * height * width
        crop_height, crop_width = round(math.sqrt(area / aspect)), round(math.sqrt(area * aspect))
        if 0 < crop_height <= height and 0 < crop_width <= width:
            top = int(rng.integers(0, height - crop_height + 1))
            left = int(rng.integers(0, width - crop_width + 1))
            return crop(sample, top, left, crop_height, crop_width)
    return sample


def fit(sample: DenseSample, size: tuple[int, int], keep_ratio: bool) -> DenseSample:
    """The sample at the model's (height, width): stretched, or resized keeping its aspect ratio and
    centred on a black canvas (maps 0 around it), as the inference preprocessing does."""
    if not keep_ratio:
        return resize(sample, size)
    height, width = sample.size
    scale = min(size[0] / height, size[1] / width)
    inner = (int(height * scale), int(width * scale))
    return pad(resize(sample, inner), (size[0] - inner[0]) // 2, (size[1] - inner[1]) // 2, size)


def augment_segmentation(
    rng: np.random.Generator, sample: DenseSample, size: tuple[int, int], class_order: np.ndarray | None
) -> DenseSample:
    """The segmentation recipe's augmentations, ending at the model's size (stretched)."""
    height, width = sample.size
    scale = min(size[0] / height, size[1] / width) * rng.uniform(0.4, 2.0)
    sample = resize(sample, (max(1, round(height * scale)), max(1, round(width * scale))))
    if rng.random() < 0.3 and (sample.size[0] > size[0] or sample.size[1] > size[1]):
        crop_height, crop_width = min(size[0], sample.size[0]), min(size[1], sample.size[1])
        top = int(rng.integers(0, sample.size[0] - crop_height + 1))
        left = int(rng.integers(0, sample.size[1] - crop_width + 1))
        sample = crop(sample, top, left, crop_height, crop_width)
    sample.image = blur_and_noise(rng, sample.image)
    if rng.random() < 0.5:
        sample = rotate(sample, rng.uniform(-60, 60))
    if rng.random() < 0.5:
        sample = flip(sample, class_order)
    sample.image = colour_jitter(rng, sample.image)
    return fit(sample, size, keep_ratio=False)


def augment_geometry(
    rng: np.random.Generator,
    sample: DenseSample,
    size: tuple[int, int],
    flip_probability: float,
    keep_ratio: bool,
) -> DenseSample:
    """Random scale and crop (p 0.3 each) and flip, ending at the model's size."""
    if rng.random() < 0.3:
        sample = random_scale(rng, sample, 0.5, 2.0)
    if rng.random() < 0.3:
        sample = random_crop(rng, sample)
    if rng.random() < flip_probability:
        sample = flip(sample)
    return fit(sample, size, keep_ratio)


def _interpolation(kind: str) -> int:
    return cv2.INTER_NEAREST if kind in NEAREST_MAPS else cv2.INTER_LINEAR
