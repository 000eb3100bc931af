"""Pictures of Sapiens2 predictions as uint8 RGB (H, W, 3) arrays, drawn with numpy and OpenCV."""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache

import cv2
import numpy as np

from sapiens2.data.metadata import BodyPartMeta, KeypointMeta
from sapiens2.vision.dense import alpha_to_uint8
from sapiens2.vision.pose_decoding import Person

DEPTH_BACKGROUND = 128  # grey level (128, 128, 128): far from every turbo colour, reads as "no data"
CHECKER_GREYS = (204, 153)
BOX_COLOR = (255, 255, 255)
RIM_COLOR = (255, 255, 255)
_PANEL = 28  # grey level behind legends and titles
_TEXT = (240, 240, 240)
_FONT = cv2.FONT_HERSHEY_SIMPLEX
_SHIFT = 4  # fractional bits of the coordinates handed to OpenCV, for sub-pixel anti-aliased drawing
_PERCENTILE_SAMPLES = 1 << 20


def _rgb(image: np.ndarray) -> np.ndarray:
    """The image as uint8 (H, W, 3); grey images are expanded and an alpha channel is dropped."""
    image = np.asarray(image)
    if image.dtype != np.uint8:
        raise ValueError(f"expected a uint8 image, got {image.dtype}")
    if image.ndim == 2:
        return cv2.cvtColor(image, cv2.COLOR_GRAY2RGB)
    if image.ndim == 3 and image.shape[2] == 3:
        return image
    if image.ndim == 3 and image.shape[2] == 4:
        return np.ascontiguousarray(image[..., :3])
    raise ValueError(f"expected an (H, W), (H, W, 3) or (H, W, 4) image, got {image.shape}")


def _plane(values: np.ndarray, shape: tuple[int, int] | None, what: str) -> np.ndarray:
    values = np.asarray(values)
    if values.ndim != 2 or (shape is not None and values.shape != shape):
        raise ValueError(f"{what} must be a 2-D array of shape {shape or '(H, W)'}, got {values.shape}")
    return values


def _keep_only(picture: np.ndarray, keep: np.ndarray, grey: int) -> np.ndarray:
    """The picture where keep is true, one grey level elsewhere."""
    keep = _plane(keep, picture.shape[:2], "mask").astype(bool, copy=False).view(np.uint8)
    out = np.full(picture.shape, grey, dtype=np.uint8)  # a scalar fill is several times faster than a colour
    cv2.copyTo(picture, keep, out)
    return out


def _text(canvas: np.ndarray, text: str, origin: tuple[int, int], scale: float, color=_TEXT) -> None:
    thickness = max(1, round(scale * 1.6))
    cv2.putText(canvas, text, origin, _FONT, scale, color, thickness, cv2.LINE_AA)


def _small_keypoints(meta: KeypointMeta) -> np.ndarray:
    """True for the face and hand keypoints, drawn smaller than the body's."""
    small = np.zeros(len(meta.names), dtype=bool)
    for group in ("face", "left_hand", "right_hand"):
        small[list(meta.groups.get(group, ()))] = True
    return small


def _polylines(canvas: np.ndarray, shapes: np.ndarray, colors, widths) -> None:
    """Anti-aliased polylines (M, points, 2) in fixed-point pixels, in their colours ((M, 3) or one) and
    widths ((M,) or one), with one OpenCV call per colour and width. A one-point polyline is a disc of that
    diameter, the same pixels as cv2.circle's."""
    if len(shapes) == 0:
        return
    colors = np.broadcast_to(np.asarray(colors, dtype=np.int64), (len(shapes), 3))
    widths = np.broadcast_to(np.asarray(widths, dtype=np.int64), (len(shapes),))
    kinds, style_of = np.unique(np.column_stack([colors, widths]), axis=0, return_inverse=True)
    closed = shapes.shape[1] == 1
    for index, (red, green, blue, width) in enumerate(kinds.tolist()):
        chosen = np.ascontiguousarray(shapes[style_of.ravel() == index], dtype=np.int32)
        cv2.polylines(canvas, chosen, closed, (red, green, blue), width, cv2.LINE_AA, _SHIFT)


def draw_pose(
    image: np.ndarray,
    persons: Sequence[Person],
    meta: KeypointMeta,
    threshold: float = 0.3,
    show_boxes: bool = False,
) -> np.ndarray:
    """Skeletons over the image: links, then keypoints whose score is at least threshold (face and hands
    first, then the body joints with a white rim), and a tracked person's id at its box's corner.

    Sizes follow the image size, and shrink for persons much smaller than the image.
    """
    canvas = _rgb(image).copy()
    small = _small_keypoints(meta)
    links = np.asarray(meta.links, dtype=np.int64).reshape(-1, 2)
    link_colors = np.asarray(meta.link_colors, dtype=np.int64).reshape(-1, 3)
    keypoint_colors = np.asarray(meta.keypoint_colors, dtype=np.int64).reshape(-1, 3)
    thin_links = small[links[:, 0]] & small[links[:, 1]]
    image_unit = max(canvas.shape[:2]) / 640
    limit = 8 * max(canvas.shape[:2])  # keeps wild coordinates inside OpenCV's integer range
    for person in persons:
        box, keypoints, scores = person.box, person.keypoints, person.scores
        unit = max(0.5, min(image_unit, max(box[2], box[3]) / 320))
        thickness, radius = max(1, round(2 * unit)), max(2, round(3 * unit))
        visible = (scores >= threshold) & np.isfinite(keypoints).all(axis=1)
        points = np.round(np.clip(np.nan_to_num(keypoints), -limit, limit) * (1 << _SHIFT)).astype(np.int64)
        shown = visible[links[:, 0]] & visible[links[:, 1]]
        widths = np.where(thin_links, max(1, thickness // 2), thickness)
        _polylines(canvas, points[links[shown]], link_colors[shown], widths[shown])
        face_hands, body = np.flatnonzero(visible & small), np.flatnonzero(visible & ~small)
        discs = points[:, None, :]
        _polylines(canvas, discs[face_hands], keypoint_colors[face_hands], 2 * max(1, round(unit)))
        # A white rim keeps body joints visible on links of their own colour.
        _polylines(canvas, discs[body], RIM_COLOR, 2 * radius + thickness)
        _polylines(canvas, discs[body], keypoint_colors[body], 2 * radius)
        if show_boxes:
            x, y, w, h = np.round(box).astype(int).tolist()
            cv2.rectangle(canvas, (x, y), (x + w, y + h), BOX_COLOR, thickness, cv2.LINE_AA)
        if person.track_id is not None:
            _id_label(canvas, str(person.track_id), box, unit)
    return canvas


def _id_label(canvas: np.ndarray, text: str, box: np.ndarray, unit: float) -> None:
    """A tracked person's id in white on black at the top-left corner of its box, kept inside the image."""
    scale, thickness = 0.5 * unit, max(1, round(unit))
    (width, height), base = cv2.getTextSize(text, cv2.FONT_HERSHEY_SIMPLEX, scale, thickness)
    pad = max(1, round(2 * unit))
    x = int(np.clip(np.nan_to_num(box[0]), 0, max(0, canvas.shape[1] - width - 2 * pad)))
    y = int(np.clip(np.nan_to_num(box[1]), 0, max(0, canvas.shape[0] - height - base - 2 * pad)))
    cv2.rectangle(canvas, (x, y), (x + width + 2 * pad, y + height + base + 2 * pad), (0, 0, 0), cv2.FILLED)
    origin = (x + pad, y + pad + height)
    cv2.putText(canvas, text, origin, cv2.FONT_HERSHEY_SIMPLEX, scale, BOX_COLOR, thickness, cv2.LINE_AA)


def _labels(seg: np.ndarray, count: int, shape: tuple[int, int] | None = None) -> np.ndarray:
    """Class ids as uint8, checked against the number of classes."""
    seg = _plane(seg, shape, "segmentation")
    if not np.issubdtype(seg.dtype, np.integer):
        raise ValueError(f"segmentation must hold integer class ids, got {seg.dtype}")
    if seg.size and (seg.min() < 0 or seg.max() >= count):
        raise ValueError(f"segmentation ids must lie in [0, {count}), got [{seg.min()}, {seg.max()}]")
    return seg.astype(np.uint8, copy=False)


def overlay_segmentation(
    image: np.ndarray, seg: np.ndarray, palette: Sequence[Sequence[int]] | np.ndarray, opacity: float = 0.5
) -> np.ndarray:
    """The image blended with the palette colour of each pixel's class (opacity 1 shows only the colours)."""
    image = _rgb(image)
    palette = np.asarray(palette, dtype=np.uint8).reshape(-1, 3)
    labels = _labels(seg, len(palette), image.shape[:2])
    table = np.zeros((256, 1, 3), dtype=np.uint8)
    table[: len(palette), 0] = palette
    colors = cv2.applyColorMap(labels, table)
    opacity = float(np.clip(opacity, 0.0, 1.0))
    return cv2.addWeighted(image, 1.0 - opacity, colors, opacity, 0.0)


def label_counts(seg: np.ndarray, count: int) -> np.ndarray:
    """Pixels per class (count,) int64 of a map of class ids below `count`."""
    labels = _labels(seg, count)
    if labels.size > 1 << 24:  # beyond float32's exact integers
        return np.bincount(labels.ravel(), minlength=count)
    # OpenCV's histogram counts about six times faster than np.bincount.
    histogram = cv2.calcHist([np.ascontiguousarray(labels)], [0], None, [256], [0, 256])
    return histogram.ravel()[:count].astype(np.int64)


def segmentation_legend(seg: np.ndarray, meta: BodyPartMeta, width: int = 380) -> np.ndarray:
    """A panel of the classes present, largest first, with their share of the non-background pixels."""
    counts = label_counts(seg, len(meta.names))
    person = int(counts[1:].sum())
    present = sorted((k for k in range(1, len(counts)) if counts[k]), key=lambda k: -counts[k])
    row, scale = 30, 0.55
    panel = np.full((row * (len(present) + 1) + 10, width, 3), _PANEL, dtype=np.uint8)
    _text(panel, "Share of person pixels" if present else "No person pixels", (10, 22), scale)
    for line, k in enumerate(present, start=1):
        top = line * row + 4
        cv2.rectangle(panel, (10, top), (32, top + row - 8), meta.palette[k], -1)
        _text(panel, meta.names[k].replace("_", " "), (42, top + row - 12), scale)
        share = f"{100.0 * counts[k] / person:.1f} %"
        (text_width, _), _ = cv2.getTextSize(share, _FONT, scale, max(1, round(scale * 1.6)))
        _text(panel, share, (width - 10 - text_width, top + row - 12), scale)
    return panel


def normals_picture(normals: np.ndarray, background_mask: np.ndarray | None = None) -> np.ndarray:
    """Unit normals (H, W, 3) shown as RGB = (n + 1) / 2, with black where background_mask is true."""
    normals = np.asarray(normals, dtype=np.float32)
    if normals.ndim != 3 or normals.shape[2] != 3:
        raise ValueError(f"normals must be (H, W, 3), got {normals.shape}")
    picture = cv2.convertScaleAbs(normals, alpha=127.5, beta=127.5)
    return picture if background_mask is None else _keep_only(picture, np.logical_not(background_mask), 0)


@cache
def _turbo_table() -> np.ndarray:
    """OpenCV's turbo colour map as an RGB lookup table (within one level of matplotlib's)."""
    bgr = cv2.applyColorMap(np.arange(256, dtype=np.uint8).reshape(256, 1), cv2.COLORMAP_TURBO)
    return np.ascontiguousarray(bgr[:, :, ::-1])


def _percentiles(values: np.ndarray, mask: np.ndarray, q: Sequence[float]) -> np.ndarray:
    """Percentiles of values[mask], from a regular grid of about a million pixels when the image is larger."""
    step = max(1, int(np.sqrt(mask.size / _PERCENTILE_SAMPLES)))
    sample = values[::step, ::step][mask[::step, ::step]]
    if sample.size == 0:  # a foreground too thin for the grid
        sample = values[mask]
    return np.percentile(sample, q)


def depth_picture(depth: np.ndarray, foreground_mask: np.ndarray) -> np.ndarray:
    """Inverse depth of the foreground in turbo colours, stretched between its 1st and 99th percentiles.

    Near is red, far is blue; the background and non-finite depths are grey (DEPTH_BACKGROUND).
    """
    depth = _plane(depth, None, "depth").astype(np.float32, copy=False)
    finite = np.isfinite(depth)
    valid = _plane(foreground_mask, depth.shape, "foreground_mask").astype(bool, copy=False) & finite
    if not valid.any():
        return np.full((*depth.shape, 3), DEPTH_BACKGROUND, dtype=np.uint8)
    if not finite.all():
        depth = np.where(finite, depth, 1.0).astype(np.float32)
    near, far = _percentiles(depth, valid, (1, 99))
    inverse_low, inverse_high = 1.0 / max(far, 1e-6), 1.0 / max(near, 1e-6)
    # Same bins as matplotlib's 256-entry colour map applied to the normalized inverse depth.
    scale = 256.0 / (inverse_high - inverse_low + 1e-8)
    index = np.reciprocal(np.maximum(depth, np.float32(1e-6)))
    index -= np.float32(inverse_low)
    index *= np.float32(scale)
    np.clip(index, 0, 255, out=index)
    index = index.astype(np.uint8)
    colors = cv2.applyColorMap(index, _turbo_table())
    return _keep_only(colors, valid, DEPTH_BACKGROUND)


def alpha_picture(alpha: np.ndarray) -> np.ndarray:
    """The alpha matte (H, W) in [0, 1] as a grey picture: white is foreground."""
    return cv2.cvtColor(alpha_to_uint8(alpha), cv2.COLOR_GRAY2RGB)


def checkerboard(height: int, width: int, cell: int | None = None) -> np.ndarray:
    """The light/dark grey checkerboard that shows transparency; cells grow with the picture size."""
    cell = cell or max(8, round(max(height, width) / 64))
    light, dark = CHECKER_GREYS
    columns = (np.arange(width) // cell) % 2
    rows = np.array([np.where(columns, dark, light), np.where(columns, light, dark)], dtype=np.uint8)
    return cv2.cvtColor(rows[(np.arange(height) // cell) % 2], cv2.COLOR_GRAY2RGB)


def cutout_on_checkerboard(image: np.ndarray, alpha: np.ndarray) -> np.ndarray:
    """The image blended over a checkerboard by the alpha matte (H, W) in [0, 1] (or uint8 0-255)."""
    image = np.ascontiguousarray(_rgb(image))
    matte = alpha_to_uint8(alpha, image.shape[:2])
    out = checkerboard(*image.shape[:2])
    cv2.copyTo(image, (matte == 255).view(np.uint8), out)
    # Only the partly transparent pixels (a matte's edges) need blending: the same cv2.blendLinear as a
    # whole-picture blend, which leaves the opaque and the transparent ones as they are now.
    partial = np.flatnonzero((matte > 0) & (matte < 255))
    if len(partial):
        weight = (matte.ravel()[partial].astype(np.float32) * np.float32(1 / 255))[:, None]
        pixels, board = image.reshape(-1, 3)[partial, None], out.reshape(-1, 3)[partial, None]
        out.reshape(-1, 3)[partial] = cv2.blendLinear(pixels, board, weight, 1.0 - weight)[:, 0]
    return out


def _principal_axes(x: np.ndarray, count: int, iterations: int = 6, oversample: int = 8) -> np.ndarray:
    """The count leading principal directions (C, count) of centred rows x (N, C), by subspace iteration."""
    width = min(x.shape[1], count + oversample)
    basis = np.random.default_rng(0).standard_normal((x.shape[1], width)).astype(np.float32)
    for _ in range(iterations):
        basis, _ = np.linalg.qr(x.T @ (x @ basis))
    projected = x @ basis
    _, vectors = np.linalg.eigh(projected.T @ projected)
    axes = basis @ vectors[:, ::-1][:, :count]
    # Fix each axis' sign (its largest loading positive) so the colours do not flip between runs.
    signs = np.sign(axes[np.abs(axes).argmax(axis=0), np.arange(axes.shape[1])])
    return axes * np.where(signs == 0, 1, signs)


def pca_picture(features: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """The 3 leading principal components of patch features (C, h, w) as RGB, resized to size (H, W).

    Each component is stretched between its 1st and 99th percentiles; the resize is bilinear.
    """
    features = np.asarray(features, dtype=np.float32)
    if features.ndim != 3:
        raise ValueError(f"features must be (C, h, w), got {features.shape}")
    channels, rows, columns = features.shape
    x = features.reshape(channels, -1).T
    x = x - x.mean(axis=0)
    components = x @ _principal_axes(x, min(3, channels))
    low, high = np.percentile(components, (1, 99), axis=0)
    scaled = np.clip((components - low) / np.maximum(high - low, 1e-8), 0.0, 1.0) * 255.0
    rgb = np.zeros((rows * columns, 3), dtype=np.uint8)
    rgb[:, : scaled.shape[1]] = np.round(scaled)
    height, width = size
    return cv2.resize(rgb.reshape(rows, columns, 3), (width, height), interpolation=cv2.INTER_LINEAR)


def fit_for_display(picture: np.ndarray, max_side: int) -> np.ndarray:
    """The picture shrunk (area averaging) so that its longer side is at most `max_side`, else as it is."""
    height, width = picture.shape[:2]
    scale = max_side / max(height, width)
    if scale >= 1:
        return picture
    size = (max(1, round(width * scale)), max(1, round(height * scale)))
    return cv2.resize(picture, size, interpolation=cv2.INTER_AREA)
