"""Dense predictions back onto the photo: segmentation labels, normals, pointmaps, matting and composites.

Every function takes and returns batched torch tensors on the model's device; `to_hwc` gives numpy arrays.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from sapiens2.processing import ProcessorSettings, Size, unpad

RGB = tuple[int, int, int]
Background = RGB | np.ndarray | torch.Tensor | None


def resize_maps(maps: torch.Tensor, size: Size) -> torch.Tensor:
    """Bilinear resize (no antialiasing, half-pixel centers) of (B, C, h, w) maps to `size` (H, W)."""
    if tuple(maps.shape[-2:]) == tuple(size):
        return maps
    return F.interpolate(maps, size=tuple(size), mode="bilinear", align_corners=False)


def segmentation_scores(logits: torch.Tensor, size: Size | None = None) -> torch.Tensor:
    """Per-class scores (B, C, H, W): the logits resized to `size`; their arg-max is the segmentation."""
    return logits if size is None else resize_maps(logits, size)


def _linear_taps(in_size: int, out_size: int, device: torch.device) -> tuple[torch.Tensor, ...]:
    """Source indices (i0, i1) and weights (w0, w1) of torch's bilinear resize along one axis."""
    ratio = torch.tensor(in_size, dtype=torch.float32) / out_size
    source = (ratio * (torch.arange(out_size, dtype=torch.float32) + 0.5) - 0.5).clamp_min(0)
    first = source.long().clamp_max(in_size - 1)
    second = first + (first < in_size - 1).long()
    weight = (source - first).clamp(0, 1)
    return first.to(device), second.to(device), (1 - weight).to(device), weight.to(device)


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
    corner_values = values[:, corners].permute(1, 2, 0).to(wide)  # (K, 4, C)
    best_two = corner_values.topk(2, dim=-1).values
    own = corner_values.gather(2, corner_labels.unsqueeze(1).expand(-1, 4, -1))
    is_top = corner_labels.unsqueeze(2) == corner_labels.unsqueeze(1)
    leads = own - torch.where(is_top, best_two[..., 1:], best_two[..., :1])
    return leads, corner_values.abs().amax(dim=(1, 2))


def segmentation_labels(logits: torch.Tensor, size: Size | None = None) -> torch.Tensor:
    """Class index maps (B, H, W) int64: arg-max over classes of the logits (B, C, h, w) resized to `size`.

    Equal to `segmentation_scores(logits, size).argmax(1)` without resizing every class. Where the 2x2
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
    y0, y1, wy0, wy1 = _linear_taps(height, size[0], device)
    x0, x1, wx0, wx1 = _linear_taps(width, size[1], device)
    small = labels.to(torch.uint8) if classes <= 256 else labels  # an eighth of the bytes to gather
    out = small.index_select(1, y0).index_select(2, x0).long()
    cell_batch, cell_row, cell_column = _mixed_cells(small)
    if len(cell_row) == 0:
        return out

    # The mixed cells' corners (i, j), (i, j+1), (i+1, j), (i+1, j+1), clamped, as flat indices.
    values = logits.transpose(0, 1).reshape(classes, -1)  # (C, B * h * w), a view when B == 1
    top_left = (cell_batch * height + cell_row) * width + cell_column
    right = (cell_column < width - 1).long().unsqueeze(1) * torch.tensor([0, 1, 0, 1], device=device)
    below = (cell_row < height - 1).long().unsqueeze(1) * torch.tensor([0, 0, width, width], device=device)
    corners = top_left.unsqueeze(1) + right + below
    corner_labels = labels.flatten()[corners]
    leads, magnitude = _candidate_leads(values, corners, corner_labels)

    # Each mixed cell covers a block of output pixels: rows whose y0 is its row, columns whose x0 its
    # column. Every per-cell quantity is spread to the block's pixels with one gather.
    row_start, row_count = _cell_pixels(cell_row, y0, height)
    column_start, column_count = _cell_pixels(cell_column, x0, width)
    pixels_per_cell = row_count * column_count
    first_pixel = torch.cumsum(pixels_per_cell, 0) - pixels_per_cell
    cell = torch.repeat_interleave(pixels_per_cell)
    if len(cell) == 0:  # a downscale can skip every mixed cell
        return out
    counts = torch.stack([row_start, column_start, column_count, first_pixel, cell_batch], dim=1)
    row_start, column_start, column_count, first_pixel, pixel_batch = counts.index_select(0, cell).unbind(1)
    block_row = torch.div(
        torch.arange(len(cell), device=device) - first_pixel, column_count, rounding_mode="floor"
    )
    row = row_start + block_row
    column = column_start + (torch.arange(len(cell), device=device) - first_pixel - block_row * column_count)
    row_weights = torch.stack([wy0, wy1], dim=1).index_select(0, row)
    column_weights = torch.stack([wx0, wx1], dim=1).index_select(0, column)
    weights = (row_weights.unsqueeze(2) * column_weights.unsqueeze(1)).flatten(1)  # (P, 4), corner order
    # Rounding of the resized logits (to their dtype) and of the bound, with a wide margin.
    rounding = (torch.finfo(values.dtype).eps + 64 * torch.finfo(torch.float32).eps) * magnitude
    cell_data = torch.cat([leads.flatten(1), rounding.unsqueeze(1)], dim=1).index_select(0, cell)
    bound, candidate = torch.einsum("pi,pij->pj", weights, cell_data[:, :16].view(-1, 4, 4)).max(dim=1)
    flat = (pixel_batch * size[0] + row) * size[1] + column
    out.view(-1)[flat] = corner_labels.index_select(0, cell).gather(1, candidate.unsqueeze(1)).squeeze(1)

    left = (bound <= cell_data[:, 16]).nonzero().squeeze(1)
    if len(left):
        tap = [values.index_select(1, corner) for corner in corners.index_select(0, cell[left]).T]
        (wy0, wy1), (wx0, wx1) = row_weights[left].T, column_weights[left].T
        # Same weights and order of operations as torch's CPU bilinear kernel: along x, then along y.
        mixed = (tap[0] * wx0 + tap[1] * wx1) * wy0 + (tap[2] * wx0 + tap[3] * wx1) * wy1
        out.view(-1)[flat[left]] = _class_index(mixed.to(logits.dtype), dim=0)
    return out


def _photo_maps(
    maps: torch.Tensor, source_size: Size, settings: ProcessorSettings, size: Size | None
) -> torch.Tensor:
    """Maps at model input resolution without the padding, resized to `size` or else the photo size."""
    return resize_maps(unpad(maps, source_size, settings), size or source_size)


def normals_to_image(
    normals: torch.Tensor, source_size: Size, settings: ProcessorSettings, size: Size | None = None
) -> torch.Tensor:
    """Unit surface normals (B, 3, H, W) of a photo of `source_size` (height, width): L2-normalized at
    model resolution, unpadded, then resized to `size` (default: the photo size)."""
    return _photo_maps(F.normalize(normals, p=2, dim=1, eps=1e-8), source_size, settings, size)


def pointmap_to_image(
    pointmaps: torch.Tensor,
    scales: torch.Tensor | None,
    source_size: Size,
    settings: ProcessorSettings,
    size: Size | None = None,
) -> torch.Tensor:
    """Per-pixel XYZ (B, 3, H, W) of a photo: pointmaps divided by the predicted scales (B, 1), unpadded,
    then resized to `size` (default: the photo size)."""
    if scales is not None:
        pointmaps = pointmaps / scales[:, :, None, None]
    return _photo_maps(pointmaps, source_size, settings, size)


def matting_to_image(
    foregrounds: torch.Tensor, alphas: torch.Tensor, size: Size | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Premultiplied foregrounds (B, 3, H, W) and alphas (B, 1, H, W), resized to `size` and clipped to
    [0, 1] when a size is given, as they are otherwise."""
    if size is None:
        return foregrounds, alphas
    both = F.interpolate(torch.cat([foregrounds, alphas], dim=1), size=tuple(size), mode="bilinear")
    both = both.clamp_(0.0, 1.0)
    return both[:, :3], both[:, 3:]


def _to_uint8(values: torch.Tensor) -> torch.Tensor:
    """[0, 1] floats to uint8, the torchvision way (times 255.999, truncated)."""
    return values.mul_(255.999).to(torch.uint8)


def _background(background: RGB | np.ndarray | torch.Tensor, size: Size, like: torch.Tensor) -> torch.Tensor:
    """A background as (1 or B, 3, H, W) floats in [0, 1]: a colour fills, an image is stretched to fit."""
    if isinstance(background, tuple | list):
        if len(background) != 3 or not all(0 <= int(value) <= 255 for value in background):
            raise ValueError(f"background colour must be three values in 0..255, got {background!r}")
        pixels = torch.tensor([int(value) for value in background], dtype=torch.uint8).view(1, 3, 1, 1)
        return pixels.to(device=like.device, dtype=like.dtype).mul_(1 / 255).expand(1, 3, *size)
    if isinstance(background, np.ndarray):
        if background.dtype != np.uint8 or background.ndim != 3 or background.shape[2] != 3:
            raise ValueError(
                f"background image must be uint8 (H, W, 3), not {background.dtype} {background.shape}"
            )
        background = torch.from_numpy(np.ascontiguousarray(background)).permute(2, 0, 1)
    if not isinstance(background, torch.Tensor) or background.ndim not in (3, 4) or background.shape[-3] != 3:
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
    pixels = _background(background, (foreground.shape[-2], foreground.shape[-1]), foreground)
    return _to_uint8(torch.addcmul(foreground, 1 - alpha, pixels).clamp_(0.0, 1.0))


def to_hwc(tensor: torch.Tensor) -> np.ndarray:
    """A (C, H, W) tensor as a numpy (H, W, C) array, or an (H, W) one as (H, W), on the CPU."""
    array = tensor.detach().cpu()
    return (array.permute(1, 2, 0) if array.ndim == 3 else array).contiguous().numpy()
