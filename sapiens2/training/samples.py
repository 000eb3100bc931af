"""Model inputs and targets from dataset records: one torch Dataset per task, with or without augmentation.

An item is asked for by (record index, stream position): in training, the augmentation's generator is
seeded with the run's seed and the stream position, so a sample is the same whatever the process, the
worker or the resume point that loads it. Validation items (stream position None) are not augmented.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch.utils.data import Dataset

from sapiens2.models import losses
from sapiens2.training import augment, codecs, datasets
from sapiens2.training.augment import DenseSample
from sapiens2.training.datasets import ClassSet, DenseRecord, KeypointSet, PoseRecord
from sapiens2.vision.processing import (
    BOX_PADDING,
    ProcessorSettings,
    boxes_xywh_to_cxcywh,
    crop_windows,
    normalize,
)

Key = tuple[int, int | None]


def sample_generator(seed: int, position: int) -> np.random.Generator:
    """The augmentation generator of the sample at `position` of the training stream."""
    return np.random.default_rng((seed, 1, position))


def pixel_values(image: np.ndarray, settings: ProcessorSettings) -> torch.Tensor:
    """A normalized (3, H, W) float32 model input from an (H, W, 3) uint8 RGB image."""
    return normalize(torch.from_numpy(np.ascontiguousarray(image)).permute(2, 0, 1)[None], settings)[0]


class TaskSamples(Dataset):
    """Items of one task's records at the model's input size."""

    def __init__(
        self, records: Sequence, settings: ProcessorSettings, seed: int = 0, augmentation: bool = True
    ) -> None:
        self.records = list(records)
        self.settings = settings
        self.seed = seed
        self.augmentation = augmentation

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, key: Key) -> dict[str, torch.Tensor]:
        index, position = key
        rng = sample_generator(self.seed, position) if self.augmentation and position is not None else None
        return self.item(self.records[index], rng)

    def item(self, record, rng: np.random.Generator | None) -> dict[str, torch.Tensor]:
        raise NotImplementedError


class PoseSamples(TaskSamples):
    """Person crops with heatmap targets (training) or with their box and keypoints (validation)."""

    def __init__(
        self,
        records: Sequence[PoseRecord],
        settings: ProcessorSettings,
        keypoints: KeypointSet,
        sigma: float | None = None,
        seed: int = 0,
        augmentation: bool = True,
        heatmap_size: tuple[int, int] | None = None,
    ) -> None:
        super().__init__(records, settings, seed, augmentation)
        self.keypoints = keypoints
        self.heatmap_size = heatmap_size or (settings.height // 4, settings.width // 4)
        self.sigma = sigma or codecs.default_sigma(self.heatmap_size)

    def item(self, record: PoseRecord, rng: np.random.Generator | None) -> dict[str, torch.Tensor]:
        image = datasets.load_rgb(record.image)
        box = torch.tensor([record.box], dtype=torch.float32)
        center, size = (
            t[0].numpy().astype(np.float64)
            for t in crop_windows(boxes_xywh_to_cxcywh(box), self.settings.size, BOX_PADDING)
        )
        rotation = 0.0
        if rng is not None:
            center, size, rotation = augment.random_person_window(rng, center, size)
        matrix = augment.udp_warp_matrix(center, size, rotation, self.settings.size)
        crop = augment.warp_person(image, matrix, self.settings.size)
        keypoints = augment.transform_points(record.keypoints, matrix)
        height, width = self.settings.size
        inside = (
            (keypoints[:, 0] >= 0)
            & (keypoints[:, 0] < width)
            & (keypoints[:, 1] >= 0)
            & (keypoints[:, 1] < height)
        )
        visible = record.visible * inside
        if rng is not None:
            if self.keypoints.flip_pairs and rng.random() < 0.5:
                crop = crop[:, ::-1]
                keypoints, visible = augment.flip_keypoints(
                    keypoints, visible, width, self.keypoints.flip_pairs
                )
            if rng.random() < 0.8:
                crop = augment.colour_jitter(rng, crop)
        heatmaps, weights = codecs.encode_heatmaps(
            keypoints, visible, self.settings.size, self.heatmap_size, self.sigma
        )
        item = {
            "pixel_values": pixel_values(crop, self.settings),
            "heatmaps": torch.from_numpy(heatmaps),
            "weights": torch.from_numpy(weights),
        }
        if rng is None:  # validation: what the metric compares with
            item |= {
                "boxes": box[0],
                "keypoints": torch.from_numpy(record.keypoints.astype(np.float32)),
                "visible": torch.from_numpy(record.visible.astype(np.float32)),
            }
        return item


class SegmentationSamples(TaskSamples):
    """Photos with class-id labels (H, W) int64."""

    def __init__(
        self,
        records: Sequence[DenseRecord],
        settings: ProcessorSettings,
        classes: ClassSet,
        seed: int = 0,
        augmentation: bool = True,
    ) -> None:
        super().__init__(records, settings, seed, augmentation)
        self.num_classes = len(classes.names)
        pairs = datasets.mirrored_pairs(classes.names)
        self.class_order = augment.flip_order(self.num_classes, pairs).astype(np.uint8)

    def item(self, record: DenseRecord, rng: np.random.Generator | None) -> dict[str, torch.Tensor]:
        image = datasets.load_rgb(record.image)
        classes = datasets.load_classes(record.target, self.num_classes, image.shape[:2])
        sample = DenseSample(image, {"classes": classes})
        if rng is None:
            sample = augment.fit(sample, self.settings.size, self.settings.do_pad)
        else:
            sample = augment.augment_segmentation(rng, sample, self.settings.size, self.class_order)
        return {
            "pixel_values": pixel_values(sample.image, self.settings),
            "labels": torch.from_numpy(sample.maps["classes"].astype(np.int64)),
        }


class NormalSamples(TaskSamples):
    """Photos with unit normals (3, H, W) and their labelled-pixel mask (1, H, W)."""

    def item(self, record: DenseRecord, rng: np.random.Generator | None) -> dict[str, torch.Tensor]:
        image = datasets.load_rgb(record.image)
        normals = datasets.load_normals(record.target, image.shape[:2])
        mask = datasets.load_mask(record, image.shape[:2])
        labelled = np.isfinite(normals).all(-1) & (np.abs(np.nan_to_num(normals)).sum(-1) > 0)
        mask = labelled if mask is None else mask & labelled
        sample = DenseSample(image, {"normals": np.nan_to_num(normals), "mask": mask.astype(np.uint8)})
        if rng is not None:
            sample.image = augment.colour_jitter(rng, sample.image)
            sample = augment.augment_geometry(rng, sample, self.settings.size, 0.3, self.settings.do_pad)
            sample.image = augment.blur_and_noise(rng, sample.image, solarize=True)
        else:
            sample = augment.fit(sample, self.settings.size, self.settings.do_pad)
        mask = sample.maps["mask"] > 0
        normals = sample.maps["normals"]
        normals = normals / np.maximum(np.linalg.norm(normals, axis=-1, keepdims=True), 1e-6)
        return {
            "pixel_values": pixel_values(sample.image, self.settings),
            "normals": torch.from_numpy(
                np.where(mask[..., None], normals, 0).transpose(2, 0, 1).astype(np.float32)
            ),
            "mask": torch.from_numpy(mask[None].astype(np.float32)),
        }


class PointmapSamples(TaskSamples):
    """Photos with canonical pointmaps (3, H, W), mask (1, H, W), camera (3, 3) and focal scale (1,)."""

    def item(self, record: DenseRecord, rng: np.random.Generator | None) -> dict[str, torch.Tensor]:
        image = datasets.load_rgb(record.image)
        depth, camera = datasets.load_depth_and_camera(record, image.shape[:2])
        mask = depth > 0
        given = datasets.load_mask(record, image.shape[:2])
        mask = mask if given is None else mask & given
        sample = DenseSample(image, {"depth": depth, "mask": mask.astype(np.uint8)}, camera)
        if rng is not None:
            sample.image = augment.colour_jitter(rng, sample.image)
            sample = augment.augment_geometry(rng, sample, self.settings.size, 0.3, self.settings.do_pad)
        else:
            sample = augment.fit(sample, self.settings.size, self.settings.do_pad)
        mask = (sample.maps["mask"] > 0) & (sample.maps["depth"] > 0)
        pointmap, scale = canonical_pointmap(sample.maps["depth"], sample.camera, mask)
        return {
            "pixel_values": pixel_values(sample.image, self.settings),
            "pointmaps": torch.from_numpy(pointmap),
            "mask": torch.from_numpy(mask[None].astype(np.float32)),
            "intrinsics": torch.from_numpy(sample.camera.astype(np.float32)),
            "scales": torch.tensor([scale], dtype=torch.float32),
        }


def canonical_pointmap(depth: np.ndarray, camera: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, float]:
    """The pointmap (3, H, W) float32 of a depth map (H, W) seen by `camera`, scaled by the canonical focal
    length / fx as the official targets are (0 where `mask` is False), and that scale."""
    rows, columns = np.indices(depth.shape, dtype=np.float64)
    x = (columns - camera[0, 2]) * depth / camera[0, 0]
    y = (rows - camera[1, 2]) * depth / camera[1, 1]
    scale = losses.CANONICAL_FOCAL_LENGTH / float(camera[0, 0])
    points = np.stack([x, y, depth.astype(np.float64)]) * scale * mask
    return points.astype(np.float32), scale


class MattingSamples(TaskSamples):
    """Photos with labels (4, H, W), premultiplied foreground then alpha, and the pixels whose foreground is
    known: all with a foreground file, else where the photo's colours are the foreground's
    (`losses.foreground_mask`)."""

    def item(self, record: DenseRecord, rng: np.random.Generator | None) -> dict[str, torch.Tensor]:
        image = datasets.load_rgb(record.image)
        maps = {"alpha": datasets.load_alpha(record.target, image.shape[:2])}
        if record.extra is not None:
            foreground = datasets.load_rgb(record.extra)
            if foreground.shape != image.shape:
                raise datasets.DatasetError(f"{record.extra}: not the size of its photo {record.image}")
            maps["foreground"] = foreground.astype(np.float32) / 255
        sample = DenseSample(image, maps)
        if rng is not None:
            sample = augment.augment_geometry(rng, sample, self.settings.size, 0.5, self.settings.do_pad)
        else:
            sample = augment.fit(sample, self.settings.size, self.settings.do_pad)
        photo = sample.image.astype(np.float32) / 255
        alpha = np.clip(sample.maps["alpha"], 0, 1)[..., None]
        foreground = sample.maps.get("foreground", photo)
        labels = np.concatenate([foreground * alpha, alpha], axis=-1).transpose(2, 0, 1)
        labels = torch.from_numpy(np.ascontiguousarray(labels, dtype=np.float32))
        given = "foreground" in sample.maps
        known = torch.ones_like(labels[3:]) if given else losses.foreground_mask(labels[3:])
        return {
            "pixel_values": pixel_values(sample.image, self.settings),
            "labels": labels,
            "foreground_weights": known,
        }
