"""Training datasets: the documented folder layouts read into records, and each record's pixels and labels.

Layouts (`--data DIR`, and the same for `--val DIR`; images are JPEG, PNG, WebP, BMP or TIFF):

- pose: `DIR/annotations.json`, COCO keypoints: `images` (id, file_name), `annotations` (image_id, bbox
  [x, y, w, h], keypoints [x, y, v] * K with v > 0 for a labelled point), `categories[0]` with optional
  `keypoints` (names), `skeleton` (1-based pairs, as COCO) and `flip_pairs` (0-based pairs). Image files
  are looked up in `DIR/images/` then `DIR/`. Without names, a 308-keypoint file takes the Sapiens2 set.
- segment: `DIR/images/NAME.*` and `DIR/masks/NAME.png` (class id per pixel, 255 = not labelled), with
  an optional `DIR/classes.json`: a list of names, or {"names": [...], "palette": [[r, g, b], ...],
  "class_weights": [...]}.
- normals: `DIR/images/NAME.*`, `DIR/normals/NAME.npy` (H, W, 3 float, camera space in the convention of
  the checkpoint being fine-tuned; x is negated on a horizontal flip) or `NAME.png` (n = 2 * rgb / 255 - 1),
  optional `DIR/masks/NAME.png` (non-zero = labelled).
- depth: `DIR/images/NAME.*`, `DIR/pointmaps/NAME.npy` (H, W, 3 camera-space XYZ) or `DIR/depth/NAME.npy`
  (H, W), optional `DIR/masks/NAME.png` and `DIR/intrinsics/NAME.json` ({"fx", "fy", "cx", "cy"} in pixels,
  or a 3x3 matrix); without intrinsics a pointmap's camera is fitted to it (a depth map needs them).
- matting: `DIR/images/NAME.*`, `DIR/alphas/NAME.png` (8 or 16-bit grey), optional
  `DIR/foregrounds/NAME.png` (the subject's straight RGB colours; else the photo's own colours are used).
"""

from __future__ import annotations

import io
import json
import re
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np
import torch
from PIL import Image

from sapiens2.data import metadata
from sapiens2.data.metadata import keypoints308
from sapiens2.errors import DatasetError, LimitError
from sapiens2.models.losses import fit_intrinsics
from sapiens2.vision.files import file_problem, open_regular
from sapiens2.vision.limits import Limits, too_large_unknown

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp", ".bmp", ".tif", ".tiff")
IGNORE_LABEL = 255
ANNOTATIONS = "annotations.json"
CLASSES = "classes.json"
# A person's box must lie at least half in its photo, and a labelled keypoint within a tenth of the photo's
# long side of it (annotators place hidden feet or hands a little past the border, never far).
OUTSIDE_SHARE = 0.5
OUTSIDE_MARGIN = 0.1


@dataclass(frozen=True)
class KeypointSet:
    """Names, flip pairs (0-based) and skeleton links (0-based) of a dataset's keypoints."""

    names: tuple[str, ...]
    flip_pairs: tuple[tuple[int, int], ...]
    skeleton: tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class ClassSet:
    """Class names, RGB palette and optional cross-entropy weights of a segmentation dataset."""

    names: tuple[str, ...]
    palette: tuple[tuple[int, int, int], ...]
    class_weights: tuple[float, ...] | None = None


@dataclass(frozen=True)
class PoseRecord:
    """One annotated person: its photo, box (x, y, w, h), keypoints (K, 2) and labelled flags (K,)."""

    image: Path
    box: tuple[float, float, float, float]
    keypoints: np.ndarray
    visible: np.ndarray


@dataclass(frozen=True)
class DenseRecord:
    """One photo and its label files: the main map, an optional mask and an optional extra file
    (intrinsics for depth, foreground colours for matting)."""

    image: Path
    target: Path
    mask: Path | None = None
    extra: Path | None = None


Record = PoseRecord | DenseRecord


# ---- layout readers --------------------------------------------------------------------------------------


def read_pose(directory: Path) -> tuple[list[PoseRecord], KeypointSet]:
    """Every labelled person of `directory/annotations.json` and the file's keypoint set."""
    path = directory / ANNOTATIONS
    data = _json(path)
    for key in ("images", "annotations"):
        if not isinstance(data.get(key), list):
            raise DatasetError(f"{path}: '{key}' must be a list (COCO keypoints layout)")
    categories = data.get("categories") or [{}]
    if not isinstance(categories, list) or not isinstance(categories[0], dict):
        raise DatasetError(f"{path}: 'categories' must be a list of objects")
    files = {}
    for index, image in enumerate(data["images"]):
        if not isinstance(image, dict) or "id" not in image or not isinstance(image.get("file_name"), str):
            raise DatasetError(f"{path}: images[{index}] needs an 'id' and a 'file_name'")
        files[image["id"]] = image["file_name"]
    count = _keypoint_count(path, data["annotations"], categories[0])
    keypoint_set = _keypoint_set(path, categories[0], count)
    records = []
    sizes: dict[Path, tuple[int, int] | None] = {}
    for index, annotation in enumerate(data["annotations"]):
        where = f"{path}: annotations[{index}]"
        if not isinstance(annotation, dict):
            raise DatasetError(f"{where} is not an object")
        if annotation.get("iscrowd"):
            continue
        if annotation.get("image_id") not in files:
            raise DatasetError(f"{where}.image_id {annotation.get('image_id')!r} is not in 'images'")
        box = _numbers(where + ".bbox", annotation.get("bbox"), 4)
        values = _numbers(where + ".keypoints", annotation.get("keypoints"), 3 * count)
        points = np.asarray(values, dtype=np.float32).reshape(count, 3)
        visible = (points[:, 2] > 0).astype(np.float32)
        if box[2] <= 1 or box[3] <= 1 or not visible.any():
            continue
        image = _find_image(directory, files[annotation["image_id"]], where + ".image_id")
        if image not in sizes:
            sizes[image] = photo_size(image)
        if sizes[image] is not None:
            _check_inside(where, box, points[:, :2], keypoint_set.names, visible, sizes[image])
        records.append(PoseRecord(image, tuple(box), points[:, :2].copy(), visible))
    if not records:
        raise DatasetError(f"{path}: no annotation with a box and at least one labelled keypoint")
    return records, keypoint_set


def read_segmentation(directory: Path) -> tuple[list[DenseRecord], ClassSet | None]:
    """Photos with their class masks, and the classes of `classes.json` when there is one."""
    records = _paired(directory, "masks", (".png",))
    classes_path = directory / CLASSES
    return records, read_classes(classes_path) if classes_path.exists() else None


def read_normals(directory: Path) -> list[DenseRecord]:
    """Photos with their normal maps (.npy or .png) and optional masks."""
    return _paired(directory, "normals", (".npy", ".png"), mask=True)


def read_pointmaps(directory: Path) -> list[DenseRecord]:
    """Photos with their pointmaps or depth maps, optional masks and optional intrinsics."""
    given_points = (directory / "pointmaps").is_dir()
    folder = "pointmaps" if given_points else "depth"
    records = _paired(directory, folder, (".npy",), mask=True, extra=("intrinsics", ".json"))
    if not given_points:
        missing = [record.target.name for record in records if record.extra is None]
        if missing:
            raise DatasetError(
                f"{directory / 'intrinsics'}: depth maps need their camera; missing for "
                f"{', '.join(missing[:5])} (add DIR/intrinsics/NAME.json, or give XYZ pointmaps in "
                "DIR/pointmaps/)"
            )
    return records


def read_matting(directory: Path) -> list[DenseRecord]:
    """Photos with their alpha mattes and optional foreground colours."""
    return _paired(directory, "alphas", (".png", ".jpg", ".tif", ".tiff"), extra=("foregrounds", ".png"))


def read_classes(path: Path) -> ClassSet:
    """The classes of a `classes.json`: names, palette (default: the body-part palette, then generated
    colours) and optional class weights."""
    data = _json(path)
    if isinstance(data, list):
        data = {"names": data}
    names = data.get("names") if isinstance(data, dict) else None
    if not isinstance(names, list) or not names or not all(isinstance(name, str) and name for name in names):
        raise DatasetError(f"{path}: 'names' must be a non-empty list of class names")
    palette = data.get("palette") or data.get("colors")
    if palette is None:
        palette = metadata.palette(len(names))
    elif not isinstance(palette, list) or len(palette) != len(names):
        raise DatasetError(f"{path}: 'palette' must hold one [r, g, b] per class ({len(names)})")
    colours = tuple(
        tuple(int(v) for v in _numbers(f"{path}: palette[{i}]", c, 3)) for i, c in enumerate(palette)
    )
    if any(not 0 <= v <= 255 for colour in colours for v in colour):
        raise DatasetError(f"{path}: palette values must be within 0..255")
    weights = data.get("class_weights")
    if weights is not None:
        weights = tuple(_numbers(f"{path}: class_weights", weights, len(names)))
    if len(names) > IGNORE_LABEL:
        raise DatasetError(
            f"{path}: at most {IGNORE_LABEL} classes (mask value {IGNORE_LABEL} means unlabelled)"
        )
    return ClassSet(tuple(names), colours, weights)


def mirrored_pairs(names: Sequence[str]) -> tuple[tuple[int, int], ...]:
    """Index pairs of names that differ only by left / right (as a word: `left_hand`, `Right Hand`,
    `hand-left`); what a horizontal flip swaps."""
    keys = {}
    for index, name in enumerate(names):
        words = re.split(r"[\s_\-.]+", name.strip().lower())
        if "left" in words or "right" in words:
            side = "left" if "left" in words else "right"
            rest = tuple(word for word in words if word not in ("left", "right"))
            keys[(side, rest)] = index
    return tuple(
        (index, keys[("right", rest)])
        for (side, rest), index in keys.items()
        if side == "left" and ("right", rest) in keys
    )


# ---- one record's pixels and labels ---------------------------------------------------------------------


def photo_size(path: Path, data: bytes | None = None) -> tuple[int, int] | None:
    """A photo's (height, width) from its header (`data`: its bytes, when already read), refused above the
    pixel limit (SAPIENS2_MAX_MEGAPIXELS) before any pixel is decoded: a 20000x20000 PNG would take 1.2 GB as
    RGB, 3 GB as OpenCV reads it. None when Pillow does not know the format (OpenCV, which reads it, has its
    own pixel cap)."""
    data = read_file(path) if data is None else data
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data)) as image:
                width, height = image.size
    except Image.DecompressionBombError:
        raise DatasetError(f"{path}: {too_large_unknown(Limits.of().megapixels)}") from None
    except (OSError, ValueError, SyntaxError):
        return None
    try:
        Limits.of().check_image(width, height)
    except LimitError as error:
        raise DatasetError(f"{path}: {error}") from None
    return height, width


def read_file(path: Path) -> bytes:
    """A dataset file's bytes: a regular file only, checked on the opened file, so a named pipe or a device
    in the folder is refused at once instead of blocking the run."""
    try:
        with open_regular(path) as file:
            return file.read()
    except ValueError:
        raise DatasetError(f"{path}: the file name is not valid") from None
    except OSError as error:
        raise DatasetError(f"{path}: {file_problem(error, path.name, 'a regular file')}") from None


def _decoded(path: Path, flags: int) -> np.ndarray:
    """An image file decoded by OpenCV from its bytes, after its header passed the pixel limit."""
    data = read_file(path)
    photo_size(path, data)
    pixels = cv2.imdecode(np.frombuffer(data, np.uint8), flags)
    if pixels is None:
        raise DatasetError(f"{path}: cannot be read as an image")
    return pixels


def load_rgb(path: Path) -> np.ndarray:
    """A photo as (H, W, 3) uint8 RGB (EXIF orientation applied)."""
    return cv2.cvtColor(_decoded(path, cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB)


def load_classes(path: Path, num_classes: int, size: tuple[int, int]) -> np.ndarray:
    """A class mask (H, W) uint8, checked against the class count and the photo's size."""
    mask = _grey(path, size)
    if mask.dtype != np.uint8:
        raise DatasetError(f"{path}: class masks are 8-bit PNGs of class ids, got {mask.dtype}")
    values = np.unique(mask)
    bad = values[(values >= num_classes) & (values != IGNORE_LABEL)]
    if len(bad):
        raise DatasetError(
            f"{path}: class ids {bad.tolist()} are out of range: the model has {num_classes} classes "
            f"(0..{num_classes - 1}; {IGNORE_LABEL} = not labelled). Add a classes.json with every class, "
            "and --new-labels to train a new last layer"
        )
    return mask


def load_mask(record: DenseRecord, size: tuple[int, int]) -> np.ndarray | None:
    """The record's labelled-pixel mask (H, W) bool, or None without a mask file."""
    return None if record.mask is None else _grey(record.mask, size) > 0


def load_normals(path: Path, size: tuple[int, int]) -> np.ndarray:
    """Normals (H, W, 3) float32 from a .npy or an RGB-encoded .png."""
    if path.suffix == ".png":
        return load_rgb(path).astype(np.float32) * (2 / 255) - 1
    return _array(path, size, channels=3)


def load_depth_and_camera(record: DenseRecord, size: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """Depth (H, W) float32 (0 where unknown) and the camera matrix (3, 3) of a depth record."""
    is_pointmap = record.target.parent.name == "pointmaps"
    values = _array(record.target, size, channels=3 if is_pointmap else None)
    depth = values[..., 2] if is_pointmap else values
    depth = np.where(np.isfinite(depth) & (depth > 0), depth, 0).astype(np.float32)
    if record.extra is not None:
        return depth, _intrinsics(record.extra)
    return depth, fit_camera(values, depth > 0, record.target)


def fit_camera(pointmap: np.ndarray, valid: np.ndarray, path: Path) -> np.ndarray:
    """The pinhole camera (3, 3) that best projects a pointmap (H, W, 3) onto its pixel grid."""
    valid = valid & np.isfinite(pointmap).all(-1)
    if valid.sum() < 3 or np.ptp(pointmap[valid][:, 0] / pointmap[valid][:, 2]) < 1e-9:
        raise DatasetError(
            f"{path}: too few points spread across the image to fit its camera; add intrinsics"
        )
    points = torch.from_numpy(np.where(valid[..., None], pointmap, 0)).permute(2, 0, 1)[None].double()
    camera = fit_intrinsics(points, torch.from_numpy(valid)[None, None])[0].numpy()
    if not (np.isfinite(camera).all() and camera[0, 0] > 0 and camera[1, 1] > 0):
        raise DatasetError(f"{path}: its points do not fit a camera looking along +Z; add intrinsics")
    return camera


def load_alpha(path: Path, size: tuple[int, int]) -> np.ndarray:
    """An alpha matte (H, W) float32 in [0, 1] from an 8 or 16-bit grey image."""
    alpha = _grey(path, size)
    scale = 65535.0 if alpha.dtype == np.uint16 else 255.0
    return alpha.astype(np.float32) / scale


# ---- helpers --------------------------------------------------------------------------------------------


def _json(path: Path):
    try:
        return json.loads(read_file(path))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise DatasetError(f"{path}: not valid JSON ({error})") from None


def _numbers(where: str, value, count: int) -> list[float]:
    if (
        not isinstance(value, (list, tuple))
        or len(value) != count
        or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and np.isfinite(v) for v in value)
    ):
        shown = f"{len(value)} values" if isinstance(value, (list, tuple)) else repr(value)
        raise DatasetError(f"{where} must hold {count} numbers, got {shown}")
    return [float(v) for v in value]


def _keypoint_count(path: Path, annotations: list, category: dict) -> int:
    names = category.get("keypoints")
    if isinstance(names, list) and names:
        return len(names)
    for annotation in annotations:
        if isinstance(annotation, dict) and isinstance(annotation.get("keypoints"), list):
            if len(annotation["keypoints"]) % 3:
                raise DatasetError(f"{path}: keypoints must be [x, y, v] triples")
            return len(annotation["keypoints"]) // 3
    raise DatasetError(f"{path}: no annotation has 'keypoints'")


def _keypoint_set(path: Path, category: dict, count: int) -> KeypointSet:
    """Names, flip pairs and skeleton from the category, else the 308-keypoint metadata, else generic."""
    names = category.get("keypoints")
    official = keypoints308()
    if isinstance(names, list) and names:
        if not all(isinstance(name, str) for name in names):
            raise DatasetError(f"{path}: categories[0].keypoints must be names")
        names = tuple(names)
    elif count == len(official.names):
        names = official.names
    else:
        names = tuple(f"keypoint_{index}" for index in range(count))
    skeleton = category.get("skeleton")
    if skeleton is None:
        links = official.links if names == official.names else ()
    else:
        links = tuple(
            (int(a) - 1, int(b) - 1) for a, b in (_pair(path, "skeleton", p, count + 1) for p in skeleton)
        )
        if any(min(link) < 0 for link in links):
            raise DatasetError(f"{path}: categories[0].skeleton uses 1-based indices (COCO)")
    pairs = category.get("flip_pairs")
    if pairs is not None:
        flip_pairs = tuple(_pair(path, "flip_pairs", p, count) for p in pairs)
    elif names == official.names:
        flip_pairs = official.flip_pairs
    else:
        flip_pairs = mirrored_pairs(names)
    return KeypointSet(names, flip_pairs, links)


def _pair(path: Path, field: str, value, limit: int) -> tuple[int, int]:
    if (
        not isinstance(value, (list, tuple))
        or len(value) != 2
        or not all(isinstance(v, int) and 0 <= v < limit for v in value)
    ):
        raise DatasetError(
            f"{path}: categories[0].{field} entries must be index pairs below {limit}, got {value!r}"
        )
    return int(value[0]), int(value[1])


def _check_inside(
    where: str,
    box: Sequence[float],
    points: np.ndarray,
    names: Sequence[str],
    visible: np.ndarray,
    size: tuple[int, int],
) -> None:
    """Refuse a box mostly outside its photo, or a labelled keypoint well outside it: such a person trains
    on padding with a loss of zero, which hides a wrong file (normalised or another photo's coordinates)."""
    height, width = size
    x, y, w, h = box
    inside_w = max(0.0, min(x + w, width) - max(x, 0.0))
    inside_h = max(0.0, min(y + h, height) - max(y, 0.0))
    hint = (
        " Coordinates are pixels of the photo: normalised (0..1) coordinates, or another photo's, "
        "need converting first."
    )
    if inside_w * inside_h < OUTSIDE_SHARE * w * h:
        raise DatasetError(
            f"{where}.bbox {[round(v, 1) for v in box]} lies mostly outside its photo ({width}x{height} "
            f"pixels).{hint}"
        )
    margin = OUTSIDE_MARGIN * max(width, height)
    labelled = points[visible > 0]
    outside = (
        (labelled[:, 0] < -margin)
        | (labelled[:, 1] < -margin)
        | (labelled[:, 0] > width + margin)
        | (labelled[:, 1] > height + margin)
    )
    if outside.any():
        first = int(np.flatnonzero(outside)[0])
        name = np.asarray(names)[visible > 0][first]
        point = [round(float(v), 1) for v in labelled[first]]
        raise DatasetError(
            f"{where}.keypoints: {int(outside.sum())} labelled keypoint(s) lie outside its photo ({width}x"
            f"{height} pixels), the first {name} at {point}.{hint}"
        )


def _present(path: Path) -> bool:
    """Whether a file of any kind but a folder is there (a pipe or a device is refused by name when read)."""
    return path.exists() and not path.is_dir()


def _find_image(directory: Path, name: str, where: str) -> Path:
    for folder in (directory / "images", directory):
        candidate = folder / name
        if _present(candidate):
            return candidate
    raise DatasetError(f"{where}: image file {name!r} is in neither {directory / 'images'} nor {directory}")


def _images(directory: Path) -> dict[str, Path]:
    folder = directory / "images"
    if not folder.is_dir():
        raise DatasetError(f"{folder}: no such folder (expected the photos in DIR/images/)")
    images = {}
    for path in sorted(folder.iterdir()):
        if path.suffix.lower() in IMAGE_SUFFIXES and not path.name.startswith("."):
            if path.stem in images:
                raise DatasetError(
                    f"{folder}: two photos are named {path.stem} ({images[path.stem].name}, {path.name})"
                )
            images[path.stem] = path
    if not images:
        raise DatasetError(f"{folder}: no photo ({', '.join(IMAGE_SUFFIXES)})")
    return images


def _paired(
    directory: Path,
    folder: str,
    suffixes: tuple[str, ...],
    *,
    mask: bool = False,
    extra: tuple[str, str] | None = None,
) -> list[DenseRecord]:
    """One record per photo, with `directory/folder/<stem><suffix>`; every photo must have one."""
    if not directory.is_dir():
        raise DatasetError(f"{directory}: no such folder")
    labels = directory / folder
    if not labels.is_dir():
        raise DatasetError(f"{labels}: no such folder (expected one label file per photo there)")
    records, missing = [], []
    for stem, image in _images(directory).items():
        target = next((labels / f"{stem}{s}" for s in suffixes if _present(labels / f"{stem}{s}")), None)
        if target is None:
            missing.append(stem)
            continue
        mask_path = directory / "masks" / f"{stem}.png" if mask else None
        extra_path = directory / extra[0] / f"{stem}{extra[1]}" if extra else None
        records.append(
            DenseRecord(
                image,
                target,
                mask_path if mask_path is not None and _present(mask_path) else None,
                extra_path if extra_path is not None and _present(extra_path) else None,
            )
        )
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        raise DatasetError(f"{labels}: no {' or '.join(suffixes)} file for the photos {shown}")
    return records


def _grey(path: Path, size: tuple[int, int]) -> np.ndarray:
    values = _decoded(path, cv2.IMREAD_UNCHANGED)
    if values.ndim == 3:
        values = values[..., 0]
    _check_size(path, values.shape[:2], size)
    return values


def _array(path: Path, size: tuple[int, int], channels: int | None) -> np.ndarray:
    try:
        values = np.load(io.BytesIO(read_file(path)), allow_pickle=False)
    except (OSError, ValueError) as error:
        raise DatasetError(f"{path}: not a .npy array ({error})") from None
    shape = (*size, channels) if channels else size
    if values.shape != shape or not np.issubdtype(values.dtype, np.floating):
        raise DatasetError(
            f"{path}: expected a float array of shape {shape} (the photo's size), "
            f"got {values.dtype} {values.shape}"
        )
    return values.astype(np.float32, copy=False)


def _check_size(path: Path, shape: tuple[int, int], size: tuple[int, int]) -> None:
    if tuple(shape) != tuple(size):
        raise DatasetError(f"{path}: {shape[0]}x{shape[1]} pixels, but its photo is {size[0]}x{size[1]}")


def _intrinsics(path: Path) -> np.ndarray:
    data = _json(path)
    if isinstance(data, dict):
        fx, fy, cx, cy = _numbers(
            f"{path}: fx, fy, cx, cy", [data.get(k) for k in ("fx", "fy", "cx", "cy")], 4
        )
        return np.array([[fx, 0, cx], [0, fy, cy], [0, 0, 1]], dtype=np.float64)
    rows = data if isinstance(data, list) and all(isinstance(row, list) for row in data) else [data]
    values = _numbers(f"{path}: the 3x3 camera matrix", [v for row in rows for v in row], 9)
    return np.asarray(values, dtype=np.float64).reshape(3, 3)
