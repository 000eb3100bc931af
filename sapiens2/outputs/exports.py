"""Writers of predictions to files (JSON, PNG, .npy, binary .ply, .glb), each written atomically.

Every writer takes an output directory and a file stem, and returns the paths it wrote. A file appears
under its final name only once complete: it is written to a hidden temporary name, then renamed.
"""

from __future__ import annotations

import errno
import json
import math
import os
import secrets
import struct
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, BinaryIO

import cv2
import numpy as np

from sapiens2.errors import OutOfSpaceError
from sapiens2.outputs.mesh import MAX_RELATIVE_JUMP, VIEWER_FACES, pointmap_mesh, step_for_faces, write_glb
from sapiens2.outputs.partial_files import make_folder, partial
from sapiens2.vision.dense import alpha_to_uint8
from sapiens2.vision.detector import Detections
from sapiens2.vision.intrinsics import Intrinsics
from sapiens2.vision.pose_decoding import Person

POSE_FORMAT = "sapiens2-pose"
POSE_FORMAT_VERSION = 1
POSE_FRAMES_SUFFIX = "_predictions.json"
# The names of the files after the photo's stem: each written here only, by its writer, and declared by the
# tasks' exports from these constants.
POSE_JSON = "_pose.json"
SEGMENTATION_PNG, SEGMENTATION_NPY = "_segmentation.png", "_segmentation.npy"
NORMALS_NPY, NORMALS_PNG = "_normals.npy", "_normals_16bit.png"
DEPTH_NPY, DEPTH_PNG, DEPTH_JSON = "_depth.npy", "_depth_16bit.png", "_depth.json"
POINTS_PLY, MESH_GLB, MESH_PREVIEW_GLB = "_points.ply", "_mesh.glb", "_mesh_preview.glb"
CLS_NPY, PATCHES_NPY = "_cls.npy", "_patches.npy"
ALPHA, CUTOUT = "_alpha", "_cutout"  # matting's matte and cut-out, each a .png
DEPTH_FORMAT = "sapiens2-depth"
DEPTH_FORMAT_VERSION = 1
PINHOLE = "pinhole: u = fx X/Z + cx, v = fy Y/Z + cy; pixel centres at integers (column u, row v)"
Writer = Callable[[BinaryIO], None]


def _atomic_write(path: Path, write: Writer) -> Path:
    """Write a file through `write(file)` under a temporary name in the same folder, then rename it."""
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    try:
        with partial(temporary, _new_file) as descriptor:
            with os.fdopen(descriptor, "wb") as file:
                write(file)
                file.flush()
                os.fsync(file.fileno())
            os.replace(temporary, path)
    except OSError as error:
        full = _disk_full(path.parent)  # numpy's writers raise OSError without an errno on a full disk
        if full and error.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise OutOfSpaceError(errno.ENOSPC, f"no space left on the disk to write {path.name}") from error
        raise
    return path


def _new_file(path: Path) -> int:
    # os.open with 0o666 lets the umask set the permissions, as a plain open() would.
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)


def _disk_full(folder: Path) -> bool:
    """True when the file system of `folder` has (almost) no room left for an ordinary user."""
    try:
        usage = os.statvfs(folder)
    except OSError:
        return False
    return usage.f_bavail * usage.f_frsize < 1024 * 1024


def _target(directory: str | os.PathLike, stem: str, suffix: str) -> Path:
    """directory/stem+suffix, with a stem that cannot leave the directory; the directory is created."""
    if not stem or stem in {".", ".."} or any(c in stem for c in "/\\\0") or len(stem) > 200:
        raise ValueError(f"invalid file stem {stem!r}: use a plain file name without folders")
    return make_folder(directory) / f"{stem}{suffix}"


def _bytes(data: bytes | memoryview) -> Writer:
    return lambda file: file.write(data)


def _npy(array: np.ndarray) -> Writer:
    return lambda file: np.save(file, array, allow_pickle=False)


def _json(document: Any) -> Writer:
    text = json.dumps(document, allow_nan=False, separators=(",", ":"))
    return _bytes(text.encode("utf-8"))


def _png(picture: np.ndarray, text: dict[str, str] | None = None) -> Writer:
    """Lossless PNG of a uint8 or uint16 grey (H, W), RGB or RGBA picture, with Latin-1 `text` chunks
    (tEXt) right after the header chunk (IHDR: 8 bytes of signature, then 25 bytes)."""
    if picture.ndim == 3:
        picture = cv2.cvtColor(picture, cv2.COLOR_RGBA2BGRA if picture.shape[2] == 4 else cv2.COLOR_RGB2BGR)
    ok, encoded = cv2.imencode(".png", picture)
    if not ok:
        raise ValueError(f"cannot encode a {picture.dtype} {picture.shape} array as PNG")
    if not text:
        return _bytes(memoryview(encoded))
    chunks = []
    for keyword, value in text.items():
        body = b"tEXt" + keyword.encode("latin-1") + b"\0" + value.encode("latin-1")
        chunks.append(struct.pack(">I", len(body) - 4) + body + struct.pack(">I", zlib.crc32(body)))
    data = encoded.tobytes()
    return _bytes(data[:33] + b"".join(chunks) + data[33:])


def _rounded(values: np.ndarray, digits: int) -> list:
    return np.round(values, digits).tolist()


def pose_document(
    persons: Sequence[Person],
    *,
    image_size: tuple[int, int],
    keypoint_names: Sequence[str],
    model_id: str,
    detections: Detections | None = None,
) -> dict:
    """The pose JSON document (docs/pose-json-schema.json) of one image.

    Persons are in image pixels; detections, when the boxes came from the person detector, give its flags.
    """
    if detections is not None and len(detections) != len(persons):
        raise ValueError(f"{len(persons)} persons but {len(detections)} detections")
    records = []
    for person in persons:
        if len(person.keypoints) != len(keypoint_names):
            raise ValueError(f"{len(person.keypoints)} keypoints but {len(keypoint_names)} keypoint names")
        xs, ys = _rounded(person.keypoints[:, 0], 2), _rounded(person.keypoints[:, 1], 2)
        scores = _rounded(person.scores, 4)
        records.append(
            {
                "box_xywh": _rounded(person.box, 2),
                "box_score": None if person.box_score is None else round(float(person.box_score), 4),
                "keypoints": [
                    {"name": name, "x": x, "y": y, "score": s}
                    for name, x, y, s in zip(keypoint_names, xs, ys, scores, strict=True)
                ],
            }
        )
    height, width = image_size
    return {
        "format": POSE_FORMAT,
        "version": POSE_FORMAT_VERSION,
        "model": model_id,
        "image": {"width": int(width), "height": int(height)},
        "detector": {
            "fallback": bool(detections is not None and detections.fallback),
            "capped": bool(detections is not None and detections.capped),
            "found": None if detections is None else int(detections.found),
        },
        "persons": records,
    }


def write_pose_json(
    directory: str | os.PathLike,
    stem: str,
    persons: Sequence[Person],
    *,
    image_size: tuple[int, int],
    keypoint_names: Sequence[str],
    model_id: str,
    detections: Detections | None = None,
) -> list[Path]:
    """`{stem}_pose.json`: the pose document of one image (see pose_document)."""
    document = pose_document(
        persons,
        image_size=image_size,
        keypoint_names=keypoint_names,
        model_id=model_id,
        detections=detections,
    )
    return [_atomic_write(_target(directory, stem, POSE_JSON), _json(document))]


def pose_frames_document(
    frames: Sequence[tuple[str, Sequence[Person]]],
    *,
    image_size: tuple[int, int],
    threshold: float,
    video: str,
) -> dict:
    """The official demo's per-video pose JSON: frames -> instances -> bbox, keypoints, keypoint_scores.

    frames are (frame name, persons) pairs; as in the official demo, bbox is x_min, y_min, x_max, y_max;
    a tracked person's instance also has its track_id, and with motion capture its keypoints_3d.
    """
    records = []
    keypoint_count = None
    for name, persons in frames:
        instances = []
        for person in persons:
            keypoint_count = len(person.keypoints)
            box = person.box
            instance = {
                "bbox": _rounded(np.concatenate([box[:2], box[:2] + box[2:]]), 2),
                "keypoints": _rounded(person.keypoints, 2),
                "keypoint_scores": _rounded(person.scores, 4),
            }
            if person.track_id is not None:
                instance["track_id"] = int(person.track_id)
            if person.keypoints_3d is not None:  # metres, Y up; null where the point was not placed
                points = np.round(np.asarray(person.keypoints_3d, dtype=np.float64), 4)
                instance["keypoints_3d"] = [p.tolist() if np.isfinite(p).all() else None for p in points]
            instances.append(instance)
        records.append({"image_name": name, "instances": instances})
    return {
        "video": video,
        "image_size": [int(image_size[0]), int(image_size[1])],
        "num_keypoints": keypoint_count,
        "kpt_thr_used": float(threshold),
        "frames": records,
    }


def depth_document(
    *,
    model_id: str,
    image_size: tuple[int, int],
    foreground_points: int,
    camera: Intrinsics | None,
    depth_scale: float,
    mesh_step: int,
) -> dict:
    """The depth JSON of one photo: the camera its pointmap implies, the 16-bit PNG's scale and the mesh's
    grid step."""
    height, width = image_size
    return {
        "format": DEPTH_FORMAT,
        "version": DEPTH_FORMAT_VERSION,
        "model": model_id,
        "image": {"width": int(width), "height": int(height)},
        "units": "metres, at the model's scale",
        "axes": "camera: x right, y down, z away from the camera; the .glb mesh has glTF's (x, -y, -z)",
        "foreground_points": int(foreground_points),
        "camera": None if camera is None else {**camera.as_dict(), "model": PINHOLE},
        "depth_png": {"suffix": DEPTH_PNG, "metres_per_unit": depth_scale, "zero": "no depth"},
        "mesh": {"suffix": MESH_GLB, "grid_step": int(mesh_step), "max_relative_jump": MAX_RELATIVE_JUMP},
    }  # fmt: skip


def write_pose_frames_json(
    directory: str | os.PathLike,
    stem: str,
    frames: Sequence[tuple[str, Sequence[Person]]],
    *,
    image_size: tuple[int, int],
    threshold: float,
) -> list[Path]:
    """`{stem}_predictions.json`: the pose of every frame of a video, in the official demo's layout."""
    document = pose_frames_document(frames, image_size=image_size, threshold=threshold, video=stem)
    return [_atomic_write(_target(directory, stem, POSE_FRAMES_SUFFIX), _json(document))]


def write_json(directory: str | os.PathLike, stem: str, suffix: str, document: Any) -> list[Path]:
    """`{stem}{suffix}`: a JSON document (plain lists, numbers and strings; no NaN)."""
    return [_atomic_write(_target(directory, stem, suffix), _json(document))]


def write_picture(directory: str | os.PathLike, stem: str, suffix: str, picture: np.ndarray) -> list[Path]:
    """`{stem}{suffix}.png`: a uint8 RGB (H, W, 3) picture, losslessly."""
    picture = np.asarray(picture)
    if picture.dtype != np.uint8 or picture.ndim != 3 or picture.shape[2] != 3:
        raise ValueError(f"a picture must be uint8 (H, W, 3), got {picture.dtype} {picture.shape}")
    return [_atomic_write(_target(directory, f"{stem}{suffix}", ".png"), _png(picture))]


def _labels(seg: np.ndarray) -> np.ndarray:
    seg = np.asarray(seg)
    if seg.ndim != 2 or not np.issubdtype(seg.dtype, np.integer):
        raise ValueError(f"segmentation must be (H, W) integer class ids, got {seg.dtype} {seg.shape}")
    if seg.size and (seg.min() < 0 or seg.max() > 255):
        raise ValueError("segmentation class ids must fit in 0-255")
    return np.ascontiguousarray(seg, dtype=np.uint8)


def write_segmentation_png(directory: str | os.PathLike, stem: str, seg: np.ndarray) -> list[Path]:
    """`{stem}_segmentation.png`: class ids as an 8-bit grey PNG, lossless."""
    return [_atomic_write(_target(directory, stem, SEGMENTATION_PNG), _png(_labels(seg)))]


def write_segmentation_npy(directory: str | os.PathLike, stem: str, seg: np.ndarray) -> list[Path]:
    """`{stem}_segmentation.npy`: class ids (H, W) as uint8."""
    return [_atomic_write(_target(directory, stem, SEGMENTATION_NPY), _npy(_labels(seg)))]


def write_segmentation(directory: str | os.PathLike, stem: str, seg: np.ndarray) -> list[Path]:
    """`{stem}_segmentation.png` (8-bit class ids, lossless) and `{stem}_segmentation.npy` (uint8 ids)."""
    return write_segmentation_png(directory, stem, seg) + write_segmentation_npy(directory, stem, seg)


def _checked(array: np.ndarray, channels: int | None, what: str) -> np.ndarray:
    array = np.asarray(array)
    shape_ok = array.ndim == 2 if channels is None else array.ndim == 3 and array.shape[2] == channels
    if not shape_ok:
        expected = "(H, W)" if channels is None else f"(H, W, {channels})"
        raise ValueError(f"{what} must be {expected}, got {array.shape}")
    return array


def write_normals(directory: str | os.PathLike, stem: str, normals: np.ndarray) -> list[Path]:
    """`{stem}_normals.npy`: unit normals (H, W, 3) as float16."""
    normals = _checked(normals, 3, "normals").astype(np.float16)
    return [_atomic_write(_target(directory, stem, NORMALS_NPY), _npy(normals))]


def write_depth(directory: str | os.PathLike, stem: str, depth: np.ndarray) -> list[Path]:
    """`{stem}_depth.npy`: depth (H, W) as float32."""
    depth = _checked(depth, None, "depth").astype(np.float32)
    return [_atomic_write(_target(directory, stem, DEPTH_NPY), _npy(depth))]


DEPTH_SCALE_KEY = "Depth scale"  # the tEXt keyword of the 16-bit depth PNG's metres per unit
DEPTH_LEVELS = 65535  # 16-bit levels; 0 is kept for pixels without a depth


def depth_png_scale(depth: np.ndarray) -> float:
    """Metres per unit of the 16-bit depth PNG: the farthest finite depth maps to DEPTH_LEVELS (1.0 when
    there is none)."""
    farthest = float(np.fmax.reduce(depth, axis=None)) if depth.size else math.nan  # NaN only if all are
    if math.isinf(farthest):  # the largest finite depth is then among the others
        usable = depth[np.isfinite(depth) & (depth > 0)]
        farthest = float(usable.max()) if usable.size else math.nan
    return farthest / DEPTH_LEVELS if farthest > 0 else 1.0


def write_depth_png(directory: str | os.PathLike, stem: str, depth: np.ndarray, scale: float) -> list[Path]:
    """`{stem}_depth_16bit.png`: depth (H, W) as 16-bit grey, depth = value x `scale` metres; 0 where the
    depth is not finite or not in front of the camera. The scale is in the file's "Depth scale" text."""
    depth = _checked(depth, None, "depth").astype(np.float64)
    usable = np.isfinite(depth) & (depth > 0)
    levels = np.zeros(depth.shape, dtype=np.uint16)
    levels[usable] = np.clip(np.round(depth[usable] / scale), 1, DEPTH_LEVELS)
    text = {
        DEPTH_SCALE_KEY: repr(scale),
        "Description": f"Depth in metres = value x {scale!r}; 0 = no depth.",
    }
    return [_atomic_write(_target(directory, stem, DEPTH_PNG), _png(levels, text))]


def write_normals_png(directory: str | os.PathLike, stem: str, normals: np.ndarray) -> list[Path]:
    """`{stem}_normals_16bit.png`: unit normals (H, W, 3) as 16-bit RGB, value = (n + 1) / 2 x 65535 per
    axis (x, y, z of the camera: right, down, away)."""
    normals = _checked(normals, 3, "normals").astype(np.float32)
    levels = np.round((np.clip(normals, -1.0, 1.0) + 1.0) * (65535 / 2)).astype(np.uint16)
    text = {"Description": "Unit normals: n = value / 65535 x 2 - 1 per channel (x right, y down, z away)."}
    return [_atomic_write(_target(directory, stem, NORMALS_PNG), _png(levels, text))]


def _ply(points: np.ndarray, colors: np.ndarray) -> Writer:
    """Binary little-endian PLY of points (N, 3) coloured (N, 3) uint8: x y z float, red green blue uchar."""
    header = "\n".join(
        [
            "ply",
            "format binary_little_endian 1.0",
            f"element vertex {len(points)}",
            *(f"property float {axis}" for axis in "xyz"),
            *(f"property uchar {channel}" for channel in ("red", "green", "blue")),
            "end_header",
            "",
        ]
    ).encode("ascii")
    # Each vertex is 15 packed bytes: three little-endian float32 then three uint8.
    vertices = np.empty((len(points), 15), dtype=np.uint8)
    vertices[:, :12] = np.ascontiguousarray(points, dtype="<f4").view(np.uint8).reshape(-1, 12)
    vertices[:, 12:] = colors

    def write(file: BinaryIO) -> None:
        file.write(header)
        file.write(memoryview(vertices))

    return write


def _pointmap_inputs(
    points: np.ndarray, image: np.ndarray, foreground: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A pointmap (H, W, 3), its uint8 photo (H, W, 3) and its foreground (H, W) as bool, checked."""
    points = _checked(points, 3, "points")
    image = _checked(image, 3, "image")
    foreground = _checked(foreground, None, "foreground")
    if not points.shape[:2] == image.shape[:2] == foreground.shape or image.dtype != np.uint8:
        raise ValueError("points, a uint8 image and the foreground mask must share their (H, W)")
    return points, image, foreground.astype(bool, copy=False)


def _foreground_points(
    points: np.ndarray, image: np.ndarray, foreground: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The finite foreground points (N, 3) of a pointmap (H, W, 3) and their colours (N, 3) uint8."""
    points, image, foreground = _pointmap_inputs(points, image, foreground)
    keep = (foreground & np.isfinite(points).all(axis=2)).ravel()
    # np.compress on flat rows is several times faster than boolean indexing of an (H, W, 3) array.
    return np.compress(keep, points.reshape(-1, 3), axis=0), np.compress(keep, image.reshape(-1, 3), axis=0)


def write_point_cloud(
    directory: str | os.PathLike, stem: str, points: np.ndarray, image: np.ndarray, foreground: np.ndarray
) -> list[Path]:
    """`{stem}_points.ply`: the foreground pixels' 3-D points (H, W, 3) coloured by the photo (H, W, 3) uint8.

    Points are in the model's camera space; pixels with non-finite coordinates are left out.
    """
    xyz, rgb = _foreground_points(points, image, foreground)
    return [_atomic_write(_target(directory, stem, POINTS_PLY), _ply(xyz, rgb))]


def write_mesh(
    directory: str | os.PathLike,
    stem: str,
    points: np.ndarray,
    image: np.ndarray,
    foreground: np.ndarray,
    step: int = 1,
) -> list[Path]:
    """`{stem}_mesh.glb`: the pointmap (H, W, 3) as a mesh of its foreground pixels (every `step`-th row and
    column), coloured by the photo (H, W, 3) uint8, on glTF's axes (see sapiens2.outputs.mesh)."""
    mesh = pointmap_mesh(*_pointmap_inputs(points, image, foreground), step)
    return [_atomic_write(_target(directory, stem, MESH_GLB), lambda file: write_glb(file, mesh))]


def write_mesh_preview(
    directory: str | os.PathLike,
    stem: str,
    points: np.ndarray,
    image: np.ndarray,
    foreground: np.ndarray,
    max_faces: int = VIEWER_FACES,
) -> Path:
    """`{stem}_mesh_preview.glb`: the mesh at the smallest grid step that keeps it within `max_faces` faces,
    for a 3-D viewer; its node moves the vertices' median to the origin, where viewers look."""
    points, image, foreground = _pointmap_inputs(points, image, foreground)
    mesh = pointmap_mesh(points, image, foreground, step_for_faces(points, foreground, max_faces))
    centre = -np.median(mesh.vertices, axis=0) if len(mesh.vertices) else None
    return _atomic_write(
        _target(directory, stem, MESH_PREVIEW_GLB), lambda file: write_glb(file, mesh, centre)
    )


def write_matting(
    directory: str | os.PathLike, stem: str, image: np.ndarray, alpha: np.ndarray
) -> list[Path]:
    """`{stem}_alpha.png` (8-bit grey matte) and `{stem}_cutout.png` (RGBA: the image with the matte)."""
    return write_cutout(directory, stem, image, alpha, ALPHA, CUTOUT)


def write_cutout(
    directory: str | os.PathLike,
    stem: str,
    image: np.ndarray,
    alpha: np.ndarray,
    alpha_suffix: str,
    cutout_suffix: str,
) -> list[Path]:
    """`{stem}{alpha_suffix}.png` (8-bit grey alpha) and `{stem}{cutout_suffix}.png` (RGBA: the image with
    that alpha)."""
    return write_alpha(directory, stem, alpha_suffix, alpha, image) + write_rgba(
        directory, stem, cutout_suffix, image, alpha
    )


def _image_and_alpha(image: np.ndarray, alpha: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    image = _checked(image, 3, "image")
    alpha = _checked(alpha, None, "alpha")
    if image.shape[:2] != alpha.shape or image.dtype != np.uint8:
        raise ValueError("image must be uint8 and share its (H, W) with alpha")
    return image, alpha_to_uint8(alpha)


def write_alpha(
    directory: str | os.PathLike, stem: str, suffix: str, alpha: np.ndarray, image: np.ndarray
) -> list[Path]:
    """`{stem}{suffix}.png`: an alpha matte (H, W) as 8-bit grey, checked against its `image`."""
    _, alpha = _image_and_alpha(image, alpha)
    return [_atomic_write(_target(directory, stem, f"{suffix}.png"), _png(alpha))]


def write_rgba(
    directory: str | os.PathLike, stem: str, suffix: str, image: np.ndarray, alpha: np.ndarray
) -> list[Path]:
    """`{stem}{suffix}.png`: RGBA, the uint8 `image` (H, W, 3) with `alpha` (H, W) as its alpha."""
    image, alpha = _image_and_alpha(image, alpha)
    return [_atomic_write(_target(directory, stem, f"{suffix}.png"), _png(np.dstack([image, alpha])))]


def _features(cls_embedding: np.ndarray, patch_features: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    cls_embedding = np.asarray(cls_embedding, dtype=np.float32).reshape(-1)
    patch_features = np.asarray(patch_features, dtype=np.float32)
    if patch_features.ndim != 3 or patch_features.shape[0] != cls_embedding.shape[0]:
        expected = f"(C, h, w) with C = {len(cls_embedding)}"
        raise ValueError(f"patch features must be {expected}, got {patch_features.shape}")
    return cls_embedding, patch_features


def write_cls(
    directory: str | os.PathLike, stem: str, cls_embedding: np.ndarray, patch_features: np.ndarray
) -> list[Path]:
    """`{stem}_cls.npy`: the CLS embedding (C,) as float32, checked against its patch features (C, h, w)."""
    cls_embedding, _ = _features(cls_embedding, patch_features)
    return [_atomic_write(_target(directory, stem, CLS_NPY), _npy(cls_embedding))]


def write_patches(
    directory: str | os.PathLike, stem: str, cls_embedding: np.ndarray, patch_features: np.ndarray
) -> list[Path]:
    """`{stem}_patches.npy`: the patch features (C, h, w) as float32, checked against the CLS embedding."""
    _, patch_features = _features(cls_embedding, patch_features)
    return [_atomic_write(_target(directory, stem, PATCHES_NPY), _npy(patch_features))]


def write_features(
    directory: str | os.PathLike, stem: str, cls_embedding: np.ndarray, patch_features: np.ndarray
) -> list[Path]:
    """`{stem}_cls.npy` (C,) and `{stem}_patches.npy` (C, h, w), both float32."""
    return write_cls(directory, stem, cls_embedding, patch_features) + write_patches(
        directory, stem, cls_embedding, patch_features
    )
