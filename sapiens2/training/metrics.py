"""Validation metrics per task, accumulated as sums (one tensor, summed across processes) then summarized.

pose: PCK@0.05 (share of labelled keypoints within 0.05 of the person box's longer side) and the mean
keypoint error in photo pixels, from heatmaps decoded as at inference (DARK, UDP). segment: mIoU over the
classes present in labels or predictions, and each class's IoU. normals: mean angular error (degrees) and
the share of pixels under 11.25 degrees. depth: absolute relative error of Z. matting: SAD (sum of absolute
alpha errors / 1000, per image) and alpha MSE. Dense metrics are measured at the model's input size.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from sapiens2.training.datasets import IGNORE_LABEL
from sapiens2.vision.pose_decoding import decode_keypoints


class Metric:
    """Sums over a validation set: `update` adds a batch, `summary` turns the (reduced) sums into numbers."""

    size: int

    def zeros(self, device: torch.device) -> Tensor:
        return torch.zeros(self.size, dtype=torch.float64, device=device)

    def update(self, sums: Tensor, outputs, batch: dict[str, Tensor]) -> None:
        raise NotImplementedError

    def summary(self, sums: Tensor) -> dict[str, float]:
        raise NotImplementedError


class PoseMetric(Metric):
    size = 3  # labelled keypoints, summed error in pixels, keypoints within the PCK threshold

    def __init__(self, input_size: tuple[int, int]) -> None:
        self.input_size = input_size

    def update(self, sums: Tensor, outputs, batch: dict[str, Tensor]) -> None:
        boxes = batch["boxes"].float()
        keypoints, _ = decode_keypoints(outputs.heatmaps.float().cpu(), boxes.cpu(), self.input_size)
        keypoints = keypoints.to(sums.device)
        visible = batch["visible"] > 0
        error = (keypoints - batch["keypoints"]).norm(dim=-1)
        threshold = 0.05 * boxes[:, 2:].amax(dim=1, keepdim=True)
        sums += torch.stack(
            [visible.sum(), error[visible].sum(), (error <= threshold)[visible].sum()]
        ).double()

    def summary(self, sums: Tensor) -> dict[str, float]:
        count = max(float(sums[0]), 1.0)
        return {"pck@0.05": float(sums[2]) / count, "keypoint_error_px": float(sums[1]) / count}


class SegmentationMetric(Metric):
    def __init__(self, names: tuple[str, ...]) -> None:
        self.names = names
        self.size = 2 * len(names)  # intersections, then unions

    def update(self, sums: Tensor, outputs, batch: dict[str, Tensor]) -> None:
        labels = batch["labels"]
        logits = outputs.logits
        if logits.shape[-2:] != labels.shape[-2:]:
            logits = F.interpolate(
                logits.float(), size=labels.shape[-2:], mode="bilinear", align_corners=False
            )
        predicted = logits.argmax(dim=1)
        valid = labels != IGNORE_LABEL
        count = len(self.names)
        predicted, labels = predicted[valid], labels[valid]
        intersection = torch.bincount(labels[predicted == labels], minlength=count)[:count]
        union = (
            torch.bincount(labels, minlength=count)[:count]
            + torch.bincount(predicted, minlength=count)[:count]
        )
        sums += torch.cat([intersection, union - intersection]).double()

    def summary(self, sums: Tensor) -> dict[str, float]:
        count = len(self.names)
        intersection, union = sums[:count], sums[count:]
        present = union > 0
        iou = torch.where(present, intersection / union.clamp(min=1), torch.nan)
        summary = {"mIoU": float(iou[present].mean()) if present.any() else 0.0}
        summary |= {
            f"IoU/{name}": float(value)
            for name, value in zip(self.names, iou, strict=True)
            if not math.isnan(value)
        }
        return summary


class NormalMetric(Metric):
    size = 3  # labelled pixels, summed angle in degrees, pixels under 11.25 degrees

    def update(self, sums: Tensor, outputs, batch: dict[str, Tensor]) -> None:
        mask = batch["mask"][:, 0] > 0
        cosine = (F.normalize(outputs.normals.float(), dim=1) * batch["normals"]).sum(1).clamp(-1, 1)
        angle = torch.rad2deg(torch.arccos(cosine))[mask]
        sums += torch.stack([mask.sum(), angle.sum(), (angle < 11.25).sum()]).double()

    def summary(self, sums: Tensor) -> dict[str, float]:
        count = max(float(sums[0]), 1.0)
        return {"mean_angle_deg": float(sums[1]) / count, "within_11.25deg": float(sums[2]) / count}


class PointmapMetric(Metric):
    size = 2  # labelled pixels, summed |z - z*| / z*

    def update(self, sums: Tensor, outputs, batch: dict[str, Tensor]) -> None:
        target = batch["pointmaps"][:, 2]
        mask = (batch["mask"][:, 0] > 0) & (target > 0)
        error = (outputs.pointmaps[:, 2].float() - target).abs() / target.clamp(min=1e-6)
        sums += torch.stack([mask.sum(), error[mask].sum()]).double()

    def summary(self, sums: Tensor) -> dict[str, float]:
        return {"abs_rel": float(sums[1]) / max(float(sums[0]), 1.0)}


class MattingMetric(Metric):
    size = 3  # images, summed SAD, summed squared error per pixel (averaged per image)

    def update(self, sums: Tensor, outputs, batch: dict[str, Tensor]) -> None:
        error = outputs.alphas.float()[:, 0] - batch["labels"][:, 3]
        sad = error.abs().sum((1, 2)) / 1000
        mse = error.square().mean((1, 2))
        sums += torch.stack([torch.tensor(len(error), device=sums.device), sad.sum(), mse.sum()]).double()

    def summary(self, sums: Tensor) -> dict[str, float]:
        count = max(float(sums[0]), 1.0)
        return {"SAD": float(sums[1]) / count, "MSE": float(sums[2]) / count}
