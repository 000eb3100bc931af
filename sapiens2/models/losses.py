"""Training losses of every Sapiens2 task: the reference's (transformers) and the official recipes'.

`pose_loss` and `segmentation_loss` are what transformers computes for `labels=`. The `*_recipe` functions
combine the terms the official 1024x768 training configs use, with their weights (facts carried over from
`facebookresearch/sapiens2`, `sapiens/{pose,dense}/configs`); each returns its weighted terms by name, and
the training loss is their sum. Matting follows the official 1b config
(`sapiens/dense/configs/matting/gss_p3m_metasim/sapiens2_1b_matting_gss_p3m_metasim-1024x768.py`): L1, Sobel
gradient and Laplacian-pyramid losses, each weighted 1, on the alpha and on the foreground.

Masks are float or bool tensors, 1 where a pixel is labelled; a term with no labelled pixel is 0. Every
recipe term counts as 0 when it is not finite, as the official heads do.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

SEGMENTATION_IGNORE_INDEX = 255
# Canonical focal length (pixels) of the official pointmap recipe: targets are scaled by it / fx.
CANONICAL_FOCAL_LENGTH = 768.0

POSE_WEIGHTS = {"keypoint_mse": 10.0}
SEGMENTATION_WEIGHTS = {"cross_entropy": 1.0, "dice": 1.0}
NORMAL_WEIGHTS = {"cosine": 10.0, "l1": 1.0, "gradient": 10.0}
POINTMAP_WEIGHTS = {
    "l1": 2.0,
    "multiscale_l1": 1.0,
    "silog": 1.0,
    "intrinsics": 1.0,
    "shift_invariant": 1.0,
    "normals": 2.0,
    "scale": 4.0,
}
MATTING_WEIGHTS = {
    f"{name}_{target}": 1.0 for name in ("l1", "gradient", "laplacian") for target in ("alpha", "foreground")
}
# Relative pointmap terms (divided by the mean labelled depth) are capped at this value, after weighting.
POINTMAP_RELATIVE_CAP = 4.0
# Per-class cross-entropy weights of the official 29-class body-part recipe.
BODY_PART_CLASS_WEIGHTS = (
    0.1, 10, 10, 3, 2, 4, 4, 2, 2, 6, 10, 3, 3, 1, 4, 4, 2, 2, 6, 10, 3, 3, 1, 1, 10, 10, 10, 10, 10,
)  # fmt: skip

# ---- the reference's losses (transformers' `labels=`) ----------------------------------------------------


def pose_loss(heatmaps: Tensor, labels: Tensor, label_weights: Tensor | None = None) -> Tensor:
    """Masked MSE of heatmaps (B, K, h, w) against labels of the same shape.

    `label_weights` broadcasts to the labels ((B, K, 1, 1) or (B, K, h, w)): sum(w * (x - y)^2) / sum(w),
    the weights counted once per heatmap cell. Without weights, the plain mean squared error.
    """
    heatmaps = heatmaps.float()
    if label_weights is None:
        return F.mse_loss(heatmaps, labels)
    weights = label_weights.to(heatmaps.dtype).expand_as(heatmaps)
    return ((heatmaps - labels) ** 2 * weights).sum() / weights.sum()


def segmentation_loss(
    logits: Tensor, labels: Tensor, ignore_index: int = SEGMENTATION_IGNORE_INDEX
) -> Tensor:
    """Cross-entropy of logits (B, C, h, w) upsampled bilinearly to labels (B, H, W), ignored pixels left
    out."""
    upsampled = F.interpolate(logits, size=labels.shape[-2:], mode="bilinear", align_corners=False)
    return F.cross_entropy(upsampled.float(), labels, ignore_index=ignore_index)


# ---- pose recipe ----------------------------------------------------------------------------------------


def keypoint_mse_loss(heatmaps: Tensor, targets: Tensor, weights: Tensor) -> Tensor:
    """Mean over every cell of (x - y)^2 times the keypoint's weight; heatmaps, targets (B, K, h, w),
    weights (B, K)."""
    return ((heatmaps - targets) ** 2 * weights[:, :, None, None]).mean()


def pose_recipe(heatmaps: Tensor, targets: Tensor, weights: Tensor) -> dict[str, Tensor]:
    """Official pose terms: the keypoint MSE with visibility weights, x10."""
    return _weighted({"keypoint_mse": keypoint_mse_loss(heatmaps.float(), targets, weights)}, POSE_WEIGHTS)


# ---- segmentation recipe --------------------------------------------------------------------------------


def weighted_cross_entropy(
    logits: Tensor,
    labels: Tensor,
    class_weights: Tensor | None = None,
    ignore_index: int = SEGMENTATION_IGNORE_INDEX,
) -> Tensor:
    """Cross-entropy of logits (B, C, H, W) against labels (B, H, W), each pixel scaled by its class weight
    (C,), averaged over all pixels (ignored ones count as 0)."""
    return F.cross_entropy(
        logits, labels, weight=class_weights, ignore_index=ignore_index, reduction="none"
    ).mean()


def dice_loss(
    logits: Tensor, labels: Tensor, ignore_index: int = SEGMENTATION_IGNORE_INDEX, eps: float = 1e-3
) -> Tensor:
    """1 - soft Dice of softmax(logits) (B, C, H, W) against labels (B, H, W), background (class 0) left out.

    Per image, the Dice 2|P.G| / (|P|^2 + |G|^2) is averaged over the classes present in its labels; the
    loss is the batch mean, an image without any labelled foreground counting as 0.
    """
    probabilities = logits.softmax(dim=1)
    valid = (labels != ignore_index).unsqueeze(1)
    one_hot = F.one_hot(torch.where(valid[:, 0], labels, 0), logits.shape[1]).permute(0, 3, 1, 2)
    predicted = (probabilities * valid)[:, 1:]
    truth = (one_hot * valid)[:, 1:].to(predicted.dtype)
    overlap = (predicted * truth).sum((2, 3))
    dice = (2 * overlap + eps) / (predicted.square().sum((2, 3)) + truth.square().sum((2, 3)) + eps)
    present = (truth.sum((2, 3)) > 0).to(predicted.dtype)
    per_image = (dice * present).sum(1) / present.sum(1).clamp(min=1)
    counted = present.amax(1)
    return ((1 - per_image) * counted).mean()


def segmentation_recipe(
    logits: Tensor,
    labels: Tensor,
    class_weights: Tensor | None = None,
    ignore_index: int = SEGMENTATION_IGNORE_INDEX,
) -> dict[str, Tensor]:
    """Official body-part terms on logits upsampled to the labels: class-weighted cross-entropy + Dice."""
    logits = F.interpolate(logits.float(), size=labels.shape[-2:], mode="bilinear", align_corners=False)
    terms = {
        "cross_entropy": weighted_cross_entropy(logits, labels, class_weights, ignore_index),
        "dice": dice_loss(logits, labels, ignore_index),
    }
    return _weighted(terms, SEGMENTATION_WEIGHTS)


# ---- normal recipe --------------------------------------------------------------------------------------


def masked_l1_loss(prediction: Tensor, target: Tensor, mask: Tensor) -> Tensor:
    """|x - y| summed over channels and labelled pixels, divided by the labelled pixel count;
    prediction, target (B, C, H, W), mask (B, 1, H, W)."""
    mask = mask.to(prediction.dtype)
    return ((prediction - target).abs() * mask).sum() / mask.sum().clamp(min=1)


def normal_cosine_loss(prediction: Tensor, target: Tensor, mask: Tensor, eps: float = 1e-6) -> Tensor:
    """Mean of 1 - cos(angle) between predicted and target normals (B, 3, H, W) over labelled pixels."""
    mask = mask.to(prediction.dtype)
    cosine = (F.normalize(prediction, dim=1, eps=eps) * F.normalize(target, dim=1, eps=eps)).sum(
        1, keepdim=True
    )
    return ((1 - cosine) * mask).sum() / mask.sum().clamp(min=1)


def normal_gradient_loss(prediction: Tensor, target: Tensor, mask: Tensor) -> Tensor:
    """Squared error of horizontal plus vertical finite differences (B, C, H, W), over pairs of labelled
    neighbours, each direction averaged over its pair count."""
    mask = mask.to(prediction.dtype)
    total = prediction.new_zeros(())
    for dim in (3, 2):
        length = prediction.shape[dim] - 1
        difference = prediction.diff(dim=dim) - target.diff(dim=dim)
        pairs = mask.narrow(dim, 0, length) * mask.narrow(dim, 1, length)
        total = total + (difference.square() * pairs).sum() / pairs.sum().clamp(min=1)
    return total


def normal_recipe(normals: Tensor, targets: Tensor, mask: Tensor) -> dict[str, Tensor]:
    """Official normal terms: cosine x10, L1 x1 and finite-difference error x10 against unit normals."""
    normals = _resized(normals.float(), targets)
    terms = {
        "cosine": normal_cosine_loss(normals, targets, mask),
        "l1": masked_l1_loss(normals, targets, mask),
        "gradient": normal_gradient_loss(normals, targets, mask),
    }
    return _weighted(terms, NORMAL_WEIGHTS)


# ---- pointmap recipe ------------------------------------------------------------------------------------


def multiscale_l1_loss(prediction: Tensor, target: Tensor, mask: Tensor, scale_factor: int = 2) -> Tensor:
    """`masked_l1_loss` after upsampling prediction and target bilinearly (the mask nearest) by
    `scale_factor`."""
    up = {"scale_factor": scale_factor, "mode": "bilinear", "align_corners": False}
    mask = F.interpolate(mask.to(prediction.dtype), scale_factor=scale_factor, mode="nearest")
    return masked_l1_loss(F.interpolate(prediction, **up), F.interpolate(target, **up), mask)


def silog_loss(prediction: Tensor, target: Tensor, mask: Tensor, clamp_eps: float = 1e-4) -> Tensor:
    """Scale-invariant log error of depths (B, 1, H, W): per image sqrt(mean(d^2) - mean(d)^2 / 2) with
    d = log(target) - log(prediction) over labelled pixels (depths clamped to `clamp_eps`), batch mean."""
    difference = (
        target.flatten(1).clamp(min=clamp_eps).log() - prediction.flatten(1).clamp(min=clamp_eps).log()
    )
    valid = (mask.flatten(1) > 0) & ~difference.isnan()
    difference = torch.where(valid, difference, 0)
    count = valid.sum(1).to(difference.dtype).clamp(min=clamp_eps)
    variance = difference.square().sum(1) / count - 0.5 * (difference.sum(1) / count).square()
    # sqrt(0) is 0, but its gradient is not finite: a perfect image gives 0 with a zero gradient.
    positive = variance > 0
    return torch.where(positive, torch.where(positive, variance, 1).sqrt(), 0).mean()


def intrinsics_consistency_loss(prediction: Tensor, mask: Tensor, intrinsics: Tensor) -> Tensor:
    """|X - (u - cx) Z / fx| + |Y - (v - cy) Z / fy| over labelled pixels of pointmaps (B, 3, H, W), with the
    camera matrices (B, 3, 3) and u, v the pixel column and row indices."""
    batch, _, height, width = prediction.shape
    mask = mask[:, 0].to(prediction.dtype)
    x, y, z = prediction.unbind(1)
    k = intrinsics.to(prediction.dtype).view(batch, 9, 1, 1).unbind(1)
    columns = torch.arange(width, device=prediction.device, dtype=prediction.dtype)
    rows = torch.arange(height, device=prediction.device, dtype=prediction.dtype)[:, None]
    error = (x - (columns - k[2]) * z / k[0]).abs() + (y - (rows - k[5]) * z / k[4]).abs()
    return (error * mask).sum() / mask.sum().clamp(min=1)


def shift_invariant_l1_loss(prediction: Tensor, target: Tensor, mask: Tensor) -> Tensor:
    """`masked_l1_loss` of pointmaps (B, 3, H, W) after moving each one's labelled centroid to the origin."""
    mask = mask.to(prediction.dtype)
    count = mask.sum((2, 3), keepdim=True) + 1e-6
    centred_prediction = prediction - (prediction * mask).sum((2, 3), keepdim=True) / count
    centred_target = target - (target * mask).sum((2, 3), keepdim=True) / count
    return masked_l1_loss(centred_prediction, centred_target, mask)


def pointmap_normals(pointmaps: Tensor, mask: Tensor, scales: Tensor) -> tuple[Tensor, Tensor]:
    """Unit normals (B, 3, H, W) of pointmaps divided by their scales (B, 1), from the cross product of the
    right and lower neighbours' offsets (reflected at the borders); and where they are defined
    (B, 1, H, W)."""
    padded = F.pad(pointmaps / scales.view(-1, 1, 1, 1), (1, 1, 1, 1), mode="reflect")
    centre = padded[:, :, 1:-1, 1:-1]
    right = (padded[:, :, 1:-1, 2:] - centre) * 100.0
    down = (padded[:, :, 2:, 1:-1] - centre) * 100.0
    normals = torch.cross(right, down, dim=1)
    length = normals.norm(dim=1, keepdim=True)
    defined = (length > 1e-6) & (mask > 0)
    return normals / length.clamp(min=1e-6) * defined, defined


def pointmap_normal_loss(prediction: Tensor, target: Tensor, mask: Tensor, scales: Tensor) -> Tensor:
    """(1 - cos) plus the channel-mean |difference| of `pointmap_normals` of prediction and target, over the
    pixels where the target's normal is defined; pointmaps (B, 3, H, W), target scales (B, 1)."""
    predicted, _ = pointmap_normals(prediction, mask, scales)
    expected, defined = pointmap_normals(target, mask, scales)
    defined = defined.to(prediction.dtype)
    cosine = (predicted * expected).sum(1, keepdim=True).clamp(-1.0, 1.0)
    error = (1 - cosine) + (predicted - expected).abs().mean(1, keepdim=True)
    return (error * defined).sum() / defined.sum().clamp(min=1)


def scale_l1_loss(prediction: Tensor, target: Tensor) -> Tensor:
    """Mean |predicted - target| focal-length scale (B, 1)."""
    return F.l1_loss(prediction, target)


def mean_depth(pointmaps: Tensor, mask: Tensor) -> Tensor:
    """Mean Z (B, 1, 1, 1) of each pointmap (B, 3, H, W) over its labelled pixels (1 where there is none)."""
    mask = mask.to(pointmaps.dtype)
    count = mask.sum((1, 2, 3), keepdim=True)
    return torch.where(
        count > 0, (pointmaps[:, 2:] * mask).sum((1, 2, 3), keepdim=True) / count.clamp(min=1), 1
    )


def pointmap_recipe(
    pointmaps: Tensor,
    scales: Tensor | None,
    targets: Tensor,
    mask: Tensor,
    intrinsics: Tensor,
    target_scales: Tensor,
) -> dict[str, Tensor]:
    """Official pointmap terms on canonical pointmaps (B, 3, H, W) and focal scales (B, 1).

    L1, multiscale L1 and shift-invariant L1 on pointmaps divided by the target's mean labelled depth (each
    capped at 4 after weighting), SiLog on Z, intrinsics consistency with `intrinsics` (B, 3, 3) of the
    target's pixels, normals of the metric pointmaps (divided by `target_scales`), and the scale L1 when the
    model predicts scales.
    """
    pointmaps = _resized(pointmaps.float(), targets)
    depth = mean_depth(targets, mask)
    relative, relative_targets = pointmaps / depth, targets / depth
    terms = {
        "l1": masked_l1_loss(relative, relative_targets, mask),
        "multiscale_l1": multiscale_l1_loss(relative, relative_targets, mask),
        "silog": silog_loss(pointmaps[:, 2:], targets[:, 2:], mask),
        "intrinsics": intrinsics_consistency_loss(pointmaps, mask, intrinsics),
        "shift_invariant": shift_invariant_l1_loss(relative, relative_targets, mask),
        "normals": pointmap_normal_loss(pointmaps, targets, mask, target_scales),
    }
    if scales is not None:
        terms["scale"] = scale_l1_loss(scales.float(), target_scales.view(-1, 1).to(torch.float32))
    weighted = _weighted(terms, POINTMAP_WEIGHTS)
    for name in ("l1", "multiscale_l1", "shift_invariant"):
        weighted[name] = weighted[name].clamp(max=POINTMAP_RELATIVE_CAP)
    return weighted


def fit_intrinsics(pointmaps: Tensor, mask: Tensor) -> Tensor:
    """Camera matrices (B, 3, 3) that best project each pointmap (B, 3, H, W) onto its pixel grid: least
    squares of u = fx X/Z + cx and v = fy Y/Z + cy over labelled pixels with Z > 0."""
    batch, _, height, width = pointmaps.shape
    x, y, z = pointmaps.double().unbind(1)
    valid = (mask[:, 0] > 0) & (z > 0)
    safe_z = torch.where(valid, z, 1)
    columns = torch.arange(width, dtype=torch.float64, device=z.device).expand(batch, height, width)
    rows = torch.arange(height, dtype=torch.float64, device=z.device)[:, None].expand(batch, height, width)
    fx, cx = _line_fit(x / safe_z, columns, valid)
    fy, cy = _line_fit(y / safe_z, rows, valid)
    matrices = torch.zeros(batch, 3, 3, dtype=torch.float64, device=z.device)
    matrices[:, 0, 0], matrices[:, 0, 2], matrices[:, 1, 1], matrices[:, 1, 2] = fx, cx, fy, cy
    matrices[:, 2, 2] = 1
    return matrices.to(pointmaps.dtype)


def _line_fit(a: Tensor, b: Tensor, valid: Tensor) -> tuple[Tensor, Tensor]:
    """Slope and intercept (B,) of b = slope * a + intercept, least squares over `valid` entries (B, H, W)."""
    weights = valid.to(a.dtype)
    count = weights.sum((1, 2)).clamp(min=1)
    mean_a = (a * weights).sum((1, 2)) / count
    mean_b = (b * weights).sum((1, 2)) / count
    centred = (a - mean_a[:, None, None]) * weights
    slope = (centred * (b - mean_b[:, None, None])).sum((1, 2)) / centred.square().sum((1, 2)).clamp(
        min=1e-12
    )
    return slope, mean_b - slope * mean_a


# ---- matting recipe -------------------------------------------------------------------------------------


def matting_l1_loss(prediction: Tensor, target: Tensor, mask: Tensor | None = None) -> Tensor:
    """Mean |x - y| over every element of (B, C, H, W), the pixels outside `mask` (B, 1, H, W) counting as
    0 (so a mask without any pixel gives 0)."""
    error = (prediction - target).abs()
    return (error if mask is None else error * mask).mean()


def sobel_magnitude(maps: Tensor, eps: float = 1e-6) -> Tensor:
    """sqrt(gx^2 + gy^2 + eps) per channel of (B, C, H, W), the 3x3 Sobel gradients of the maps reflected at
    their borders."""
    kernel = torch.tensor([[-1, 0, 1], [-2, 0, 2], [-1, 0, 1]], dtype=maps.dtype, device=maps.device)
    kernels = torch.stack([kernel, kernel.T])[:, None]  # d/dx, d/dy
    batch, channels, height, width = maps.shape
    padded = F.pad(maps.reshape(batch * channels, 1, height, width), (1, 1, 1, 1), mode="reflect")
    gradients = F.conv2d(padded, kernels).reshape(batch, channels, 2, height, width)
    return (gradients.square().sum(2) + eps).sqrt()


def matting_gradient_loss(prediction: Tensor, target: Tensor, mask: Tensor | None = None) -> Tensor:
    """`matting_l1_loss` of the Sobel gradient magnitudes of prediction and target."""
    return matting_l1_loss(sobel_magnitude(prediction), sobel_magnitude(target), mask)


def _gaussian_5x5(maps: Tensor) -> Tensor:
    """Each channel blurred by the 5x5 binomial kernel (1 4 6 4 1)^2 / 256, reflected at the borders."""
    row = torch.tensor([1.0, 4.0, 6.0, 4.0, 1.0], dtype=maps.dtype, device=maps.device)
    kernel = (row[:, None] * row[None, :] / 256)[None, None]
    batch, channels, height, width = maps.shape
    padded = F.pad(maps.reshape(batch * channels, 1, height, width), (2, 2, 2, 2), mode="reflect")
    return F.conv2d(padded, kernel).reshape(batch, channels, height, width)


def laplacian_pyramid(maps: Tensor, levels: int = 5) -> list[Tensor]:
    """`levels - 1` band-pass levels (each map cropped to even sides minus its blurred, halved and re-doubled
    copy), then the last low-pass map."""
    pyramid = []
    for _ in range(levels - 1):
        maps = maps[:, :, : maps.shape[2] // 2 * 2, : maps.shape[3] // 2 * 2]
        halved = _gaussian_5x5(maps)[:, :, ::2, ::2]
        doubled = torch.zeros_like(maps)
        doubled[:, :, ::2, ::2] = halved * 4
        pyramid.append(maps - _gaussian_5x5(doubled))
        maps = halved
    return [*pyramid, maps]


def matting_laplacian_loss(
    prediction: Tensor, target: Tensor, mask: Tensor | None = None, levels: int = 5
) -> Tensor:
    """Mean over the `laplacian_pyramid` levels l of 2^l x `matting_l1_loss` of the levels of prediction and
    target, the mask resized (nearest) to each level."""
    total = prediction.new_zeros(())
    pairs = zip(laplacian_pyramid(prediction, levels), laplacian_pyramid(target, levels), strict=True)
    for level, (predicted, expected) in enumerate(pairs):
        if mask is not None:
            level_mask = F.interpolate(mask.to(prediction.dtype), size=predicted.shape[2:], mode="nearest")
            predicted, expected = predicted * level_mask, expected * level_mask
        total = total + 2**level * matting_l1_loss(predicted, expected)
    return total / levels


def foreground_mask(alphas: Tensor, opaque: float = 0.996) -> Tensor:
    """Where a photo's own colours are its foreground's (B, 1, H, W): opaque (alpha >= 254/255) or fully
    transparent pixels, the pixels the official recipe trains the foreground on when none is given."""
    return ((alphas >= opaque) | (alphas == 0)).to(alphas.dtype)


_MATTING_TERMS = {
    "l1": matting_l1_loss,
    "gradient": matting_gradient_loss,
    "laplacian": matting_laplacian_loss,
}


def matting_recipe(
    alphas: Tensor, foregrounds: Tensor, labels: Tensor, foreground_weights: Tensor | None = None
) -> dict[str, Tensor]:
    """Official matting terms: L1, Sobel-gradient L1 and Laplacian-pyramid L1, each on the alpha and on the
    premultiplied foreground; labels (B, 4, H, W) are premultiplied RGB foreground then alpha, and
    `foreground_weights` (B, 1, H, W) the pixels whose foreground label is known (all without it)."""
    alphas, foregrounds = _resized(alphas.float(), labels), _resized(foregrounds.float(), labels)
    target_foregrounds, target_alphas = labels[:, :3], labels[:, 3:]
    mask = None if foreground_weights is None else (foreground_weights > 0).to(alphas.dtype)
    terms = {}
    for name, loss in _MATTING_TERMS.items():
        terms[f"{name}_alpha"] = loss(alphas, target_alphas)
        terms[f"{name}_foreground"] = loss(foregrounds, target_foregrounds, mask)
    return _weighted(terms, MATTING_WEIGHTS)


# ---- shared ---------------------------------------------------------------------------------------------


def _weighted(terms: dict[str, Tensor], weights: dict[str, float]) -> dict[str, Tensor]:
    """Each term times its weight, 0 where not finite."""
    return {
        name: torch.nan_to_num(value * weights[name], nan=0.0, posinf=0.0, neginf=0.0)
        for name, value in terms.items()
    }


def _resized(prediction: Tensor, target: Tensor) -> Tensor:
    """The prediction resized bilinearly to the target's height and width when they differ."""
    if prediction.shape[-2:] == target.shape[-2:]:
        return prediction
    return F.interpolate(prediction, size=target.shape[-2:], mode="bilinear", align_corners=False)
