"""Keypoints from pose heatmaps: flip-test averaging, arg-max, UDP + DARK sub-pixel refinement and the
mapping from heatmap cells back to photo pixels through each person's crop window."""

from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np
import torch
import torch.nn.functional as F

from sapiens2.vision.processing import BOX_PADDING, Boxes, Size, as_boxes, boxes_xywh_to_cxcywh, crop_windows

DARK_KERNEL_SIZE = 11
_BLUR_CHUNK_PIXELS = 1 << 20  # heatmap cells blurred at a time on the CPU (4 MB of float32)
# Log-heatmap bounds of the official DARK refinement.
_LOG_MIN, _LOG_MAX = 1e-3, 50.0


@dataclass
class Person:
    """One person in photo pixels: box (4,) x, y, w, h, keypoints (K, 2) x, y, their scores (K,), the
    detector's score for the box (None when the box was given) and, in a tracked video, the person's id
    and, with motion capture, the keypoints in 3-D (K, 3), metres, Y up, NaN where not placed."""

    box: np.ndarray
    keypoints: np.ndarray
    scores: np.ndarray
    box_score: float | None = None
    track_id: int | None = None
    keypoints_3d: np.ndarray | None = None

    def __post_init__(self) -> None:
        self.box = np.asarray(self.box, dtype=np.float64).reshape(4)
        self.keypoints = np.asarray(self.keypoints, dtype=np.float64).reshape(-1, 2)
        self.scores = np.asarray(self.scores, dtype=np.float64).reshape(-1)
        if len(self.scores) != len(self.keypoints):
            raise ValueError(f"{len(self.keypoints)} keypoints but {len(self.scores)} scores")


def average_flip(heatmaps: torch.Tensor, heatmaps_flipped: torch.Tensor) -> torch.Tensor:
    """Flip-test heatmaps: the mean of the plain pass and the mirrored pass already flipped back by the
    model (no shift)."""
    if heatmaps.shape != heatmaps_flipped.shape:
        raise ValueError(f"heatmaps {tuple(heatmaps.shape)} and flipped ones {tuple(heatmaps_flipped.shape)}")
    return (heatmaps + heatmaps_flipped) / 2


def _gaussian_kernel(kernel_size: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """1-D Gaussian of `kernel_size` taps with OpenCV's sigma for that size (sigma=0 in cv2.GaussianBlur)."""
    sigma = 0.3 * ((kernel_size - 1) * 0.5 - 1) + 0.8
    offsets = np.arange(kernel_size) - (kernel_size - 1) / 2
    weights = np.exp(-(offsets**2) / (2 * sigma**2))
    return torch.tensor(weights / weights.sum(), dtype=dtype, device=device)


def _conv_blur(maps: torch.Tensor, kernel: torch.Tensor) -> torch.Tensor:
    """Zero-padded separable blur of (M, 1, H, W) maps with torch convolutions (fast on GPUs)."""
    radius = len(kernel) // 2
    blurred = F.conv2d(maps, kernel.view(1, 1, 1, -1), padding=(0, radius))
    return F.conv2d(blurred, kernel.view(1, 1, -1, 1), padding=(radius, 0))


def _separable_blur_reads(
    maps: torch.Tensor, kernel: torch.Tensor, which: torch.Tensor, pixels: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The same blur with OpenCV on the CPU, where torch's single-channel convolutions are very slow: the
    maximum of each blurred map (M,) and the blurred values at flat `pixels` of maps `which` (P,).

    A few maps at a time are stacked into one tall image with `radius` zero rows between them, so one
    constant-border filter pass blurs each map as if it stood alone while the stack stays in cache.
    """
    count, height, width = maps.shape
    radius = len(kernel) // 2
    source = maps.float().numpy()
    taps = kernel.float().numpy()
    chunk = max(1, _BLUR_CHUNK_PIXELS // (height * width))
    tall = np.zeros((min(chunk, count), height + radius, width), dtype=np.float32)
    maxima = np.empty(count, dtype=np.float32)
    which_np, pixels_np = which.numpy(), pixels.numpy()
    values = np.empty(len(which_np), dtype=np.float32)
    for start in range(0, count, chunk):
        part = source[start : start + chunk]
        stack = tall[: len(part)]
        stack[:, :height] = part
        out = cv2.sepFilter2D(stack.reshape(-1, width), -1, taps, taps, borderType=cv2.BORDER_CONSTANT)
        blurred = out.reshape(len(part), height + radius, width)[:, :height]
        maxima[start : start + len(part)] = blurred.max(axis=(1, 2))
        here = (which_np >= start) & (which_np < start + len(part))
        values[here] = blurred[which_np[here] - start, pixels_np[here] // width, pixels_np[here] % width]
    return torch.from_numpy(maxima).to(maps.dtype), torch.from_numpy(values).to(maps.dtype)


def heatmap_maxima(heatmaps: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Arg-max cells (N, K, 2) as float x, y, or -1 where the maximum is not positive, and maxima (N, K)."""
    n, k, _, width = heatmaps.shape
    flat = heatmaps.reshape(n, k, -1)
    if flat.device.type == "cpu" and flat.dtype in (torch.float32, torch.float64):
        # numpy's arg-max (first index on ties, like torch's) runs at memory speed, torch's max with
        # indices several times slower.
        index = torch.from_numpy(flat.numpy().argmax(axis=-1))
        scores = flat.gather(-1, index.unsqueeze(-1)).squeeze(-1)
    else:
        scores, index = flat.max(dim=-1)
    cells = torch.stack([index % width, index // width], dim=-1).to(torch.float32)
    return torch.where((scores > 0).unsqueeze(-1), cells, torch.full_like(cells, -1.0)), scores


def _blur_around(maps: torch.Tensor, cells: torch.Tensor, kernel: torch.Tensor) -> torch.Tensor:
    """Blurred values (M, 3, 3) of maps (M, H, W), zeros outside, at the 3x3 cells around `cells` (M, 2)
    x, y, clamped to the map like replicate padding. Only the (kernel size + 2)-wide square patch around
    each cell is read, and blurred along x, then along y."""
    count, height, width = maps.shape
    taps = len(kernel)
    span = torch.arange(taps + 2, device=maps.device) - (taps // 2 + 1)
    x, y = cells[:, 0].long(), cells[:, 1].long()
    rows, columns = y[:, None] + span, x[:, None] + span  # (M, taps + 2) each
    inside = ((rows >= 0) & (rows < height))[:, :, None] & ((columns >= 0) & (columns < width))[:, None, :]
    index = rows.clamp(0, height - 1)[:, :, None] * width + columns.clamp(0, width - 1)[:, None, :]
    patch = maps.reshape(count, -1).gather(1, index.view(count, -1)).view(index.shape) * inside
    along_x = patch.unfold(2, taps, 1) @ kernel  # (M, taps + 2, 3)
    blurred = along_x.unfold(1, taps, 1) @ kernel  # (M, 3 rows, 3 columns) around (x, y), unclamped
    # The window's rows and columns clamped to the map, as positions in the unclamped 3x3.
    around = torch.arange(-1, 2, device=maps.device)
    pick_rows = (y[:, None] + around).clamp(0, height - 1) - y[:, None] + 1
    pick_columns = (x[:, None] + around).clamp(0, width - 1) - x[:, None] + 1
    blurred = blurred.gather(1, pick_rows[:, :, None].expand(-1, -1, 3))
    return blurred.gather(2, pick_columns[:, None, :].expand(-1, 3, -1))


def _log_blur_at(
    maps: torch.Tensor,
    which: torch.Tensor,
    pixels: torch.Tensor,
    kernel_size: int,
    peaks: torch.Tensor | None = None,
) -> torch.Tensor:
    """The clamped log of the max-preserving blur (each blurred map rescaled to its own maximum) at flat
    `pixels` (P,) of maps `which` (P,) among maps (M, H, W) with maxima `peaks` (M,). Only the maps named
    are blurred, whole: the rescale needs each blurred map's maximum."""
    needed, position = torch.unique(which, return_inverse=True)
    chosen = maps[needed]
    kernel = _gaussian_kernel(kernel_size, maps.dtype, maps.device)
    if maps.device.type == "cpu":
        new_max, values = _separable_blur_reads(chosen, kernel, position, pixels)
    else:
        blurred = _conv_blur(chosen.unsqueeze(1), kernel)
        new_max, values = blurred.amax(dim=(1, 2, 3)), blurred.view(len(needed), -1)[position, pixels]
    old_max = chosen.amax(dim=(1, 2)) if peaks is None else peaks[needed]
    ratio = torch.where(new_max > 0, old_max / torch.where(new_max > 0, new_max, 1), 1)
    return (values * ratio[position]).clamp(_LOG_MIN, _LOG_MAX).log()


def _log_blur_around(
    maps: torch.Tensor, cells: torch.Tensor, kernel_size: int, peaks: torch.Tensor | None = None
) -> torch.Tensor:
    """The clamped log of the max-preserving blur (M, 3, 3) at the 3x3 cells around each arg-max cell;
    `peaks` are the maps' maxima when known."""
    count, height, width = maps.shape
    kernel = _gaussian_kernel(kernel_size, maps.dtype, maps.device)
    blurred = _blur_around(maps, cells, kernel)
    # A blur with zeros outside never exceeds the peak, so the rescale factor peak / max(blur) lies in
    # [1, peak / max(these values)]. When no factor in that range can bring a value to a clamp bound, the
    # factor adds one constant to the logs and cancels out of the differences that the Newton step takes.
    peaks = maps.amax(dim=(1, 2)) if peaks is None else peaks
    margin = 1 + 1e-4
    free = (blurred.amin(dim=(1, 2)) >= _LOG_MIN * margin) & (peaks * margin <= _LOG_MAX)
    logs = blurred.clamp_min(_LOG_MIN).log()
    if not free.all():
        bound = (~free).nonzero().squeeze(1)
        around = torch.arange(-1, 2, device=maps.device)
        rows = (cells[bound, 1, None].long() + around).clamp(0, height - 1)
        columns = (cells[bound, 0, None].long() + around).clamp(0, width - 1)
        pixels = (rows[:, :, None] * width + columns[:, None, :]).flatten()
        which = bound.repeat_interleave(9)
        logs[bound] = _log_blur_at(maps, which, pixels, kernel_size, peaks).view(-1, 3, 3)
    return logs


def _log_blur_read_across(
    cells: torch.Tensor, heatmaps: torch.Tensor, kernel_size: int, maps_read: torch.Tensor
) -> torch.Tensor:
    """The 3x3 log values (len(maps_read), 3, 3) around the cells of maps `maps_read` (flat indices into
    N * K), read like the official code: flat indices into the replicate-padded maps laid end to end, where
    a cell of -1 reads the padding and, one step further, the end of the previous map."""
    n, k, height, width = heatmaps.shape
    row, size = width + 2, (height + 2) * (width + 2)
    flat_cells = cells.reshape(n * k, 2)[maps_read].long()
    center = maps_read * size + flat_cells[:, 0] + 1 + (flat_cells[:, 1] + 1) * row
    around = torch.arange(-1, 2, device=heatmaps.device)
    reads = (center[:, None, None] + around[:, None] * row + around).flatten()
    reads = torch.where(reads < 0, reads + n * k * size, reads)  # a negative index counts from the end
    which, padded = reads // size, reads % size
    pixels = (padded // row - 1).clamp(0, height - 1) * width + (padded % row - 1).clamp(0, width - 1)
    maps = heatmaps.reshape(n * k, height, width)
    return _log_blur_at(maps, which, pixels, kernel_size).view(-1, 3, 3)


def _newton_step(logs: torch.Tensor) -> torch.Tensor:
    """Offsets (..., 2) x, y from the centre of 3x3 log values (..., 3, 3) to the quadratic's extremum."""
    middle, up, down = logs[..., 1, 1], logs[..., 0, 1], logs[..., 2, 1]
    left, right = logs[..., 1, 0], logs[..., 1, 2]
    gradient_x = 0.5 * (right - left)
    gradient_y = 0.5 * (down - up)
    eps = torch.finfo(logs.dtype).eps
    hessian_xx = right - 2 * middle + left + eps
    hessian_yy = down - 2 * middle + up + eps
    hessian_xy = 0.5 * (logs[..., 2, 2] - right - down + middle + middle - left - up + logs[..., 0, 0])
    determinant = hessian_xx * hessian_yy - hessian_xy * hessian_xy
    step_x = (hessian_yy * gradient_x - hessian_xy * gradient_y) / determinant
    step_y = (hessian_xx * gradient_y - hessian_xy * gradient_x) / determinant
    return torch.stack([step_x, step_y], dim=-1)


def refine_dark_udp(
    cells: torch.Tensor,
    heatmaps: torch.Tensor,
    kernel_size: int = DARK_KERNEL_SIZE,
    maxima: torch.Tensor | None = None,
) -> torch.Tensor:
    """Sub-pixel keypoints (N, K, 2): one Newton step on the blurred log-heatmap around each arg-max cell;
    `maxima` (N, K) are the maps' maxima when known (from `heatmap_maxima`)."""
    if kernel_size % 2 == 0 or kernel_size <= 1:
        raise ValueError(f"kernel_size must be an odd integer above 1, got {kernel_size}")
    n, k, height, width = heatmaps.shape
    maps, flat_cells = heatmaps.reshape(n * k, height, width), cells.reshape(n * k, 2)
    peaks = None if maxima is None else maxima.reshape(n * k)
    # A map with no positive value has the cell -1; the official code then reads the previous map too.
    undefined = (flat_cells < 0).any(dim=1)
    if not undefined.any():
        logs = _log_blur_around(maps, flat_cells, kernel_size, peaks)
    else:
        logs = maps.new_empty(n * k, 3, 3)
        defined = (~undefined).nonzero().squeeze(1)
        if len(defined):
            chosen = None if peaks is None else peaks[defined]
            logs[defined] = _log_blur_around(maps[defined], flat_cells[defined], kernel_size, chosen)
        logs[undefined] = _log_blur_read_across(cells, heatmaps, kernel_size, undefined.nonzero().squeeze(1))
    return cells - _newton_step(logs.view(n, k, 3, 3))


def heatmap_to_image(
    points: torch.Tensor,
    boxes_xywh: torch.Tensor,
    input_size: Size,
    heatmap_size: Size,
    padding: float = BOX_PADDING,
) -> torch.Tensor:
    """Map heatmap coordinates (N, K, 2) of person crops back to photo pixels (N, K, 2)."""
    centers, sizes = crop_windows(boxes_xywh_to_cxcywh(boxes_xywh), input_size, padding)
    last_cell = torch.tensor(
        [heatmap_size[1] - 1, heatmap_size[0] - 1], dtype=torch.float32, device=points.device
    )
    return points / last_cell * sizes[:, None, :] + centers[:, None, :] - 0.5 * sizes[:, None, :]


def decode_keypoints(
    heatmaps: torch.Tensor,
    boxes_xywh: Boxes,
    input_size: Size = (1024, 768),
    heatmaps_flipped: torch.Tensor | None = None,
    kernel_size: int = DARK_KERNEL_SIZE,
    padding: float = BOX_PADDING,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Keypoints (N, K, 2) float32 in photo pixels and scores (N, K) from heatmaps (N, K, h, w) of N person
    crops with boxes (N, 4) COCO x, y, w, h; `input_size` is the model input (height, width)."""
    if heatmaps.ndim != 4:
        raise ValueError(f"heatmaps must be (N, K, height, width), got {tuple(heatmaps.shape)}")
    if heatmaps_flipped is not None:
        heatmaps = average_flip(heatmaps, heatmaps_flipped)
    heatmaps = heatmaps.float()
    boxes = as_boxes(boxes_xywh, heatmaps.device)
    if len(boxes) != len(heatmaps):
        raise ValueError(f"{len(heatmaps)} heatmap sets for {len(boxes)} boxes")
    if len(heatmaps) == 0:
        return heatmaps.new_zeros(0, heatmaps.shape[1], 2), heatmaps.new_zeros(0, heatmaps.shape[1])
    cells, scores = heatmap_maxima(heatmaps)
    points = refine_dark_udp(cells, heatmaps, kernel_size, scores)
    heatmap_size = (heatmaps.shape[2], heatmaps.shape[3])
    return heatmap_to_image(points, boxes, input_size, heatmap_size, padding), scores
