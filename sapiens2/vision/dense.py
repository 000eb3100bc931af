"""Dense predictions back onto the photo: segmentation labels, normals, pointmaps, matting and composites.

Every function takes and returns batched torch tensors on the model's device; `to_hwc` gives numpy arrays.
"""

from __future__ import annotations

import cv2
import numpy as np
import torch
import torch.nn.functional as F

from sapiens2.vision.processing import ProcessorSettings, Size, unpad

RGB = tuple[int, int, int]
_COMPOSITE_ROWS = 32  # rows of a composite computed at a time on the CPU
Background = RGB | np.ndarray | torch.Tensor | None


def resize_maps(maps: torch.Tensor, size: Size, *, channels_last: bool = False) -> torch.Tensor:
    """Bilinear resize (no antialiasing, half-pixel centers) of (B, C, h, w) maps to `size` (H, W).

    `channels_last` lays the result out with each pixel's channels side by side, which `to_hwc` then
    reads without a copy; torch resizes three channels into that layout two to three times faster, with
    values within one float32 ulp of the plain resize.
    """
    if tuple(maps.shape[-2:]) == tuple(size):
        return maps
    if channels_last:
        maps = maps.contiguous(memory_format=torch.channels_last)
    return F.interpolate(maps, size=tuple(size), mode="bilinear", align_corners=False)


def _linear_taps(in_size: int, out_size: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """First source index (out,) and the weights (out, 2) of it and of the next index (clamped to the last)
    in torch's bilinear resize along one axis."""
    ratio = torch.tensor(in_size, dtype=torch.float32) / out_size
    source = (ratio * (torch.arange(out_size, dtype=torch.float32) + 0.5) - 0.5).clamp_min(0)
    first = source.long().clamp_max(in_size - 1)
    weight = (source - first).clamp(0, 1)
    return first.to(device), torch.stack([1 - weight, weight], dim=1).to(device)


def _class_index(values: torch.Tensor, dim: int) -> torch.Tensor:
    """Arg-max along `dim`, first index on ties like argmax (max's indices are several times faster)."""
    return values.max(dim=dim).indices


def _mixed_cells(labels: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """(batch, row, column) of the cells (i, j) whose label differs from one at (i, j+1), (i+1, j) or
    (i+1, j+1), clamped to the map: the 2x2 sources of a bilinear resize that disagree."""
    right = torch.cat([labels[:, :, 1:], labels[:, :, -1:]], dim=2)
    down = torch.cat([labels[:, 1:], labels[:, -1:]], dim=1)
    down_right = torch.cat([down[:, :, 1:], down[:, :, -1:]], dim=2)
    return ((labels != right) | (labels != down) | (labels != down_right)).nonzero(as_tuple=True)


def _cell_pixels(cells: torch.Tensor, first: torch.Tensor, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Start and length of the run of output pixels along one axis whose first source tap is each cell."""
    lengths = torch.bincount(first, minlength=size)
    starts = torch.cumsum(lengths, 0) - lengths
    return starts[cells], lengths[cells]


def _candidate_leads(
    values: torch.Tensor, corners: torch.Tensor, corner_labels: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(K, corner i, candidate j): how far corner j's label leads every other class at corner i (negative
    where another class is ahead), for K cells with corners (K, 4) as flat indices into values (C, N);
    and the largest magnitude (K,) among each cell's values."""
    wide = torch.promote_types(values.dtype, torch.float32)
    corner_values = values.index_select(1, corners.flatten()).T.to(wide).reshape(-1, 4, len(values))
    best_two = corner_values.topk(2, dim=-1).values
    own = corner_values.gather(2, corner_labels.unsqueeze(1).expand(-1, 4, -1))
    is_top = corner_labels.unsqueeze(2) == corner_labels.unsqueeze(1)
    leads = own - torch.where(is_top, best_two[..., 1:], best_two[..., :1])
    return leads, corner_values.abs().amax(dim=(1, 2))


def _interpolated_classes(
    values: torch.Tensor,
    corners: torch.Tensor,
    weights_y: torch.Tensor,
    weights_x: torch.Tensor,
    dtype: torch.dtype,
) -> torch.Tensor:
    """Arg-max class (P,) of values (C, N) mixed bilinearly from corners (P, 4) with tap weights (P, 2)."""
    tap = [values.index_select(1, corner) for corner in corners.T]
    (wy0, wy1), (wx0, wx1) = weights_y.T, weights_x.T
    # Same weights and order of operations as torch's CPU bilinear kernel: along x, then along y.
    mixed = (tap[0] * wx0 + tap[1] * wx1) * wy0 + (tap[2] * wx0 + tap[3] * wx1) * wy1
    return _class_index(mixed.to(dtype), dim=0)


def _banded_labels(
    logits: torch.Tensor,
    size: Size,
    y0: torch.Tensor,
    row_taps: torch.Tensor,
    x0: torch.Tensor,
    column_taps: torch.Tensor,
    band: int = 32,
) -> torch.Tensor:
    """Arg-max of the bilinearly resized logits with the same weights and order of operations as torch's CPU
    kernel, so memory stays small at any photo size: the source rows of `band` output rows are resized along
    x once, classes last, then each output row mixes its two source rows and takes the arg-max of each
    pixel's contiguous classes (1.5-2.5 times faster at 12 MP than mixing the whole band class by class)."""
    batch, _, height, width = logits.shape
    y1, x1 = (y0 + 1).clamp_max(height - 1), (x0 + 1).clamp_max(width - 1)
    wx0, wx1 = column_taps.T
    top_rows, bottom_rows = y0.tolist(), y1.tolist()
    top_weights, bottom_weights = row_taps.T
    out = torch.empty((batch, *size), dtype=torch.long, device=logits.device)
    for image in range(batch):
        maps = logits[image]
        for start in range(0, size[0], band):
            stop = min(start + band, size[0])
            first, last = top_rows[start], bottom_rows[stop - 1]
            source = maps[:, first : last + 1]
            along_x = source.index_select(2, x0) * wx0 + source.index_select(2, x1) * wx1
            along_x = along_x.permute(1, 2, 0).contiguous()  # (rows, W, classes)
            for row in range(start, stop):
                top, bottom = along_x[top_rows[row] - first], along_x[bottom_rows[row] - first]
                out[image, row] = _class_index(top * top_weights[row] + bottom * bottom_weights[row], dim=1)
    return out


def segmentation_labels(logits: torch.Tensor, size: Size | None = None) -> torch.Tensor:
    """Class index maps (B, H, W) int64: arg-max over classes of the logits (B, C, h, w) resized to `size`.

    Equal to `resize_maps(logits, size).argmax(1)` without resizing every class. Where the 2x2
    source cells under an output pixel share one arg-max, any convex mix of them has that arg-max too.
    Elsewhere, for a candidate class, the weighted sum of its lead at the four corners bounds its lead
    in the mix from below; a bound clearly above float rounding settles the pixel, and only the pixels
    left are interpolated over all classes.
    """
    labels = _class_index(logits, dim=1)
    if size is None:
        return labels
    batch, classes, height, width = logits.shape
    device = logits.device
    y0, row_taps = _linear_taps(height, size[0], device)
    x0, column_taps = _linear_taps(width, size[1], device)
    small = labels.to(torch.uint8) if classes <= 256 else labels  # an eighth of the bytes to gather
    out = small.index_select(2, x0).index_select(1, y0).long()  # columns first: rows are then copied whole
    cell_batch, cell_row, cell_column = _mixed_cells(small)
    if len(cell_row) == 0:
        return out
    if len(cell_row) > small.numel() // 8:
        # Noisy maps (untrained or tiny models) are mixed almost everywhere: resize every class instead.
        return _banded_labels(logits, size, y0, row_taps, x0, column_taps)

    # The mixed cells' corners (i, j), (i, j+1), (i+1, j), (i+1, j+1), clamped, as flat indices.
    values = logits.transpose(0, 1).reshape(classes, -1)  # (C, B * h * w), a view when B == 1
    top_left = (cell_batch * height + cell_row) * width + cell_column
    right = (cell_column < width - 1).long().unsqueeze(1) * torch.tensor([0, 1, 0, 1], device=device)
    below = (cell_row < height - 1).long().unsqueeze(1) * torch.tensor([0, 0, width, width], device=device)
    corners = top_left.unsqueeze(1) + right + below
    corner_labels = labels.flatten()[corners]
    leads, magnitude = _candidate_leads(values, corners, corner_labels)

    # Rounding of the resized logits (to their dtype) and of the bound, with a wide margin.
    rounding = (torch.finfo(values.dtype).eps + 64 * torch.finfo(torch.float32).eps) * magnitude
    # Each mixed cell covers a block of output pixels: rows whose y0 is its row, columns whose x0 is its
    # column. Blocks are laid out at the largest block size, with a mask, to handle all cells at once.
    row_start, row_count = _cell_pixels(cell_row, y0, height)
    column_start, column_count = _cell_pixels(cell_column, x0, width)
    block_rows = torch.arange(int(row_count.max()), device=device)
    block_columns = torch.arange(int(column_count.max()), device=device)
    rows = (row_start[:, None] + block_rows).clamp_max(size[0] - 1)  # (K, r)
    columns = (column_start[:, None] + block_columns).clamp_max(size[1] - 1)  # (K, c)
    inside = (block_rows < row_count[:, None])[:, :, None] & (block_columns < column_count[:, None])[
        :, None, :
    ]
    weights_y, weights_x = row_taps[rows], column_taps[columns]  # (K, r, 2), (K, c, 2)
    leads_by_tap = leads.view(-1, 2, 2, 4)  # (K, y tap, x tap, candidate)
    bound, candidate = torch.einsum("kra,kcb,kabj->krcj", weights_y, weights_x, leads_by_tap).max(dim=-1)
    flat = (cell_batch[:, None, None] * size[0] + rows[:, :, None]) * size[1] + columns[:, None, :]
    k, r, c = inside.nonzero(as_tuple=True)
    out.view(-1)[flat[k, r, c]] = corner_labels[k, candidate[k, r, c]]
    k, r, c = (inside & (bound <= rounding[:, None, None])).nonzero(as_tuple=True)
    if len(k):
        out.view(-1)[flat[k, r, c]] = _interpolated_classes(
            values, corners[k], weights_y[k, r], weights_x[k, c], logits.dtype
        )
    return out


def _photo_maps(
    maps: torch.Tensor, source_size: Size, settings: ProcessorSettings, size: Size | None
) -> torch.Tensor:
    """Maps at model input resolution without the padding, resized to `size` or else the photo size, laid
    out channels-last (for `to_hwc`)."""
    return resize_maps(unpad(maps, source_size, settings), size or source_size, channels_last=True)


def normals_to_image(
    normals: torch.Tensor, source_size: Size, settings: ProcessorSettings, size: Size | None = None
) -> torch.Tensor:
    """Unit surface normals (B, 3, H, W) of a photo of `source_size` (height, width): L2-normalized at
    model resolution, unpadded, then resized to `size` (default: the photo size)."""
    # F.normalize's formula; its norm reduction over the 3 channels is ten times slower than this sum
    # (which rounds within one float32 ulp of it).
    unit = normals / normals.square().sum(dim=1, keepdim=True).sqrt().clamp_min(1e-8)
    return _photo_maps(unit, source_size, settings, size)


# The official pointmap demo's smoothing, applied only when the map is enlarged: 4 passes of a 3x3 Gaussian
# of sigma 0.8 (in pixels of the map), the borders mirrored.
SMOOTHING_PASSES = 4
SMOOTHING_SIGMA = 0.8


def smooth_maps(
    maps: torch.Tensor, passes: int = SMOOTHING_PASSES, sigma: float = SMOOTHING_SIGMA
) -> torch.Tensor:
    """`passes` 3x3 Gaussian blurs of maps (B, C, H, W), each padded by mirroring (reflect: the edge pixel is
    not repeated); H and W must be at least 2."""
    offsets = torch.tensor([-1.0, 0.0, 1.0], dtype=maps.dtype, device=maps.device)
    taps = torch.exp(-0.5 * (offsets / sigma) ** 2)
    taps = taps / taps.sum()
    if maps.device.type == "cpu" and maps.dtype == torch.float32 and not maps.requires_grad:
        return _smooth_planes(maps, taps.numpy(), passes)
    channels = maps.shape[1]
    kernel = (taps[:, None] * taps[None, :]).expand(channels, 1, 3, 3)
    for _ in range(passes):
        maps = F.conv2d(F.pad(maps, (1, 1, 1, 1), mode="reflect"), kernel, groups=channels)
    return maps


def _smooth_planes(maps: torch.Tensor, taps: np.ndarray, passes: int) -> torch.Tensor:
    """`smooth_maps` on the CPU: OpenCV's separable filter on each plane in place, with the same mirrored
    border (its REFLECT_101) and taps, some forty times faster than the grouped convolution (within 1e-6)."""
    if min(maps.shape[-2:]) < 2:
        raise ValueError(f"maps of {tuple(maps.shape[-2:])} are too small to mirror at their borders")
    smoothed = maps.clone(memory_format=torch.contiguous_format)
    for plane in smoothed.view(-1, *maps.shape[-2:]).numpy():
        for _ in range(passes):
            cv2.sepFilter2D(plane, -1, taps, taps, dst=plane, borderType=cv2.BORDER_REFLECT_101)
    return smoothed


def pointmap_to_image(
    pointmaps: torch.Tensor,
    scales: torch.Tensor | None,
    source_size: Size,
    settings: ProcessorSettings,
    size: Size | None = None,
    smooth: bool = False,
) -> torch.Tensor:
    """Per-pixel XYZ (B, 3, H, W) of a photo: pointmaps divided by the predicted scales (B, 1), unpadded,
    then resized to `size` (default: the photo size).

    With `smooth`, maps that are enlarged on either side are first blurred by `smooth_maps`, as the official
    pointmap demo does before its pictures and point clouds.
    """
    if scales is not None:
        pointmaps = pointmaps / scales[:, :, None, None]
    maps = unpad(pointmaps, source_size, settings)
    size = size or source_size
    if smooth and (size[0] > maps.shape[-2] or size[1] > maps.shape[-1]):
        maps = smooth_maps(maps)
    return resize_maps(maps, size)


def matting_to_image(
    foregrounds: torch.Tensor, alphas: torch.Tensor, size: Size | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Premultiplied foregrounds (B, 3, H, W) and alphas (B, 1, H, W), resized to `size` and clipped to
    [0, 1] when a size is given, as they are otherwise."""
    if size is None:
        return foregrounds, alphas
    both = resize_maps(torch.cat([foregrounds, alphas], dim=1), size).clamp_(0.0, 1.0)
    return both[:, :3], both[:, 3:]


def _to_uint8(values: torch.Tensor) -> torch.Tensor:
    """[0, 1] floats to uint8, the torchvision way (times 255.999, truncated)."""
    return values.mul_(255.999).to(torch.uint8)


def _background(background: RGB | np.ndarray | torch.Tensor, size: Size, like: torch.Tensor) -> torch.Tensor:
    """A background in [0, 1]: an image (1 or B, 3, H, W) stretched to fit, or a colour (1, 3, 1, 1)."""
    if isinstance(background, tuple | list):
        if len(background) != 3 or not all(0 <= int(value) <= 255 for value in background):
            raise ValueError(f"background colour must be three values in 0..255, got {background!r}")
        pixels = torch.tensor([int(value) for value in background], dtype=torch.uint8).view(1, 3, 1, 1)
        return pixels.to(device=like.device, dtype=like.dtype).mul_(1 / 255)
    if isinstance(background, np.ndarray):
        if background.dtype != np.uint8 or background.ndim != 3 or background.shape[2] != 3:
            raise ValueError(
                f"background image must be uint8 (H, W, 3), not {background.dtype} {background.shape}"
            )
        background = torch.from_numpy(np.ascontiguousarray(background)).permute(2, 0, 1)
    if (
        not isinstance(background, torch.Tensor)
        or background.ndim not in (3, 4)
        or background.shape[-3] != 3
        or not (background.is_floating_point() or background.dtype == torch.uint8)
    ):
        raise ValueError("background must be an RGB colour, a (H, W, 3) uint8 image or a (3, H, W) tensor")
    pixels = background.to(like.device)
    pixels = pixels.to(like.dtype) if pixels.is_floating_point() else pixels.to(like.dtype).mul_(1 / 255)
    pixels = pixels if pixels.ndim == 4 else pixels.unsqueeze(0)
    return resize_maps(pixels, size)


def composite(foreground: torch.Tensor, alpha: torch.Tensor, background: Background) -> torch.Tensor:
    """uint8 picture of premultiplied `foreground` (B, 3, H, W) with `alpha` (B, 1, H, W) over a background:
    an RGB colour, an image (stretched to fit) -> (B, 3, H, W); None (transparent) -> RGBA (B, 4, H, W)."""
    if background is None:
        # Straight (not premultiplied) colour, as RGBA pictures store it.
        colour = (foreground / alpha.clamp_min(1e-6)).clamp_(0.0, 1.0)
        return _to_uint8(torch.cat([colour, alpha.clamp(0.0, 1.0)], dim=1))
    height = foreground.shape[-2]
    pixels = _background(background, (height, foreground.shape[-1]), foreground)
    out = torch.empty(foreground.shape, dtype=torch.uint8, device=foreground.device)
    # A band of rows at a time on the CPU, so that each step's result is still in cache for the next.
    step = _COMPOSITE_ROWS if foreground.device.type == "cpu" else height
    for start in range(0, height, step):
        rows = slice(start, start + step)
        under = pixels if pixels.shape[-2] == 1 else pixels[..., rows, :]
        # foreground + (1 - alpha) * background, rounded step by step like the reference (addcmul is not).
        blended = ((1 - alpha[..., rows, :]) * under).add_(foreground[..., rows, :])
        out[..., rows, :] = _to_uint8(blended.clamp_(0.0, 1.0))
    return out


def to_hwc(tensor: torch.Tensor) -> np.ndarray:
    """A (C, H, W) tensor as a numpy (H, W, C) array, or an (H, W) one as (H, W), on the CPU; a view
    when the tensor is laid out channels-last on the CPU already."""
    array = tensor.detach().cpu()
    if array.ndim == 2:
        return array.contiguous().numpy()
    hwc = array.permute(1, 2, 0)
    if hwc.is_contiguous() or array.dtype not in (torch.uint8, torch.float32) or not 1 < len(array) <= 4:
        return hwc.contiguous().numpy()
    return cv2.merge([plane.contiguous().numpy() for plane in array])  # interleaves planes fastest


def unit_vectors_(vectors: np.ndarray) -> np.ndarray:
    """Each pixel's vector of (H, W, C) float32 `vectors` scaled to unit length, in place (zero vectors
    stay zero, as with F.normalize); returns `vectors`."""
    length = np.sqrt(np.einsum("ijk,ijk->ij", vectors, vectors))
    vectors /= np.maximum(length, np.float32(1e-12), out=length)[..., None]
    return vectors


def alpha_to_uint8(alpha: np.ndarray, shape: tuple[int, int] | None = None) -> np.ndarray:
    """An (H, W) alpha matte in [0, 1] (or already uint8) as uint8 0-255, rounded; `shape` checks its size."""
    alpha = np.asarray(alpha)
    if alpha.ndim != 2 or (shape is not None and alpha.shape != tuple(shape)):
        raise ValueError(f"alpha must be a 2-D array of shape {shape or '(H, W)'}, got {alpha.shape}")
    if alpha.dtype == np.uint8:
        return alpha
    return cv2.convertScaleAbs(np.clip(alpha.astype(np.float32, copy=False), 0.0, 1.0), alpha=255.0)
