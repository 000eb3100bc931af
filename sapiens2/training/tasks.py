"""What training needs to know about each task: its model class, dataset layout, samples, loss and metric."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from sapiens2.data import metadata
from sapiens2.data.metadata import body_parts
from sapiens2.errors import TrainingError
from sapiens2.models import losses
from sapiens2.models.config import Sapiens2Config
from sapiens2.models.kinds import ModelKind
from sapiens2.tasks.registry import Task, get_task
from sapiens2.training import datasets, metrics, optim, samples
from sapiens2.training.datasets import ClassSet, KeypointSet
from sapiens2.vision.processing import ProcessorSettings

Labels = KeypointSet | ClassSet | tuple[str, ...]


@dataclass(frozen=True)
class TrainingTask:
    """One trainable task of the registry: its dataset layout, samples, recipe loss and metric."""

    task: Task
    read: Callable[[Path], tuple[list, Labels | None]]

    @property
    def name(self) -> str:
        return self.task.name

    @property
    def kind(self) -> ModelKind:
        """The kind of checkpoint the task fine-tunes."""
        return self.task.kind

    @property
    def aliases(self) -> tuple[str, ...]:
        """Other names accepted on the command line: the kind's name (seg, normal, pointmap)."""
        return (self.kind.name,) if self.kind.name != self.name else ()

    @property
    def channels(self) -> tuple[str, ...]:
        """The head's output names of the official checkpoints."""
        return tuple(self.kind.labels()["id2label"].values())

    @property
    def layer_decay(self) -> float:
        """The official layer-wise learning-rate decay: 0.9 in the matting (1b) config, 0.8 in the 0.4b
        ones."""
        return optim.MATTING_LAYER_DECAY if self.name == "matting" else optim.OFFICIAL_LAYER_DECAY

    @property
    def max_grad_norm(self) -> float:
        """The official gradient clipping norm: 4 in the matting (1b) config, 2 in the 0.4b ones."""
        return optim.MATTING_MAX_GRAD_NORM if self.name == "matting" else optim.MAX_GRAD_NORM

    @property
    def label_noun(self) -> str:
        """What the head's outputs are called in messages: keypoints, or classes."""
        return "keypoints" if self.name == "pose" else "classes"

    def checkpoint_labels(self, config: Sapiens2Config) -> Labels:
        """The labels a checkpoint's head predicts, from its config."""
        names = tuple(config.id2label[index] for index in range(config.num_labels))
        if self.name == "pose":
            return KeypointSet(names, tuple(config.flip_pairs or ()), ())
        if self.name == "segment":
            if names == body_parts().names:
                return body_part_classes()
            return ClassSet(names, metadata.palette(len(names)))
        return names

    def default_labels(self) -> Labels:
        """The labels of a new head when the dataset names none: the official ones."""
        if self.name == "segment":
            return body_part_classes()
        if self.name == "pose":
            raise TrainingError("pose needs keypoint labels from the dataset")  # datasets always give them
        return self.channels

    def samples(
        self,
        records: list,
        settings: ProcessorSettings,
        labels: Labels,
        seed: int,
        sigma: float | None = None,
        augment: bool = True,
        output_size: tuple[int, int] | None = None,
    ) -> samples.TaskSamples:
        """The task's items of `records`, augmented (in training) when `augment`; pose heatmap targets at the
        model's `output_size` (default a quarter of the input)."""
        if self.name == "pose":
            return samples.PoseSamples(records, settings, labels, sigma, seed, augment, output_size)
        if self.name == "segment":
            return samples.SegmentationSamples(records, settings, labels, seed, augment)
        kinds = {
            "normals": samples.NormalSamples,
            "depth": samples.PointmapSamples,
            "matting": samples.MattingSamples,
        }
        return kinds[self.name](records, settings, seed, augment)

    def loss_terms(self, outputs, batch: dict[str, Tensor], labels: Labels) -> dict[str, Tensor]:
        """The official recipe's weighted terms for a batch."""
        if self.name == "pose":
            return losses.pose_recipe(outputs.heatmaps, batch["heatmaps"], batch["weights"])
        if self.name == "segment":
            weights = None if labels.class_weights is None else torch.tensor(labels.class_weights)
            weights = None if weights is None else weights.to(outputs.logits.device, torch.float32)
            return losses.segmentation_recipe(outputs.logits, batch["labels"], weights)
        if self.name == "normals":
            return losses.normal_recipe(outputs.normals, batch["normals"], batch["mask"])
        if self.name == "depth":
            return losses.pointmap_recipe(
                outputs.pointmaps,
                outputs.scales,
                batch["pointmaps"],
                batch["mask"],
                batch["intrinsics"],
                batch["scales"],
            )
        return losses.matting_recipe(
            outputs.alphas, outputs.foregrounds, batch["labels"], batch["foreground_weights"]
        )

    def metric(self, settings: ProcessorSettings, labels: Labels) -> metrics.Metric:
        if self.name == "pose":
            return metrics.PoseMetric(settings.size)
        if self.name == "segment":
            return metrics.SegmentationMetric(labels.names)
        return {
            "normals": metrics.NormalMetric,
            "depth": metrics.PointmapMetric,
            "matting": metrics.MattingMetric,
        }[self.name]()


def _fixed(reader: Callable[[Path], list]) -> Callable[[Path], tuple[list, None]]:
    return lambda directory: (reader(directory), None)


_READERS: dict[str, Callable[[Path], tuple[list, Labels | None]]] = {
    "pose": datasets.read_pose,
    "segment": datasets.read_segmentation,
    "normals": _fixed(datasets.read_normals),
    "depth": _fixed(datasets.read_pointmaps),
    "matting": _fixed(datasets.read_matting),
}
TASKS: dict[str, TrainingTask] = {name: TrainingTask(get_task(name), read) for name, read in _READERS.items()}


def get_training_task(name: str) -> TrainingTask:
    """The task called `name` or one of its aliases (seg, normal, pointmap)."""
    for task in TASKS.values():
        if name == task.name or name in task.aliases:
            return task
    names = ", ".join(
        f"{t.name}" + (f" ({', '.join(t.aliases)})" if t.aliases else "") for t in TASKS.values()
    )
    raise TrainingError(f"No trainable task {name!r}; choose one of {names}.")


def body_part_classes() -> ClassSet:
    """The official 29 body-part classes with their palette and the recipe's class weights."""
    meta = body_parts()
    return ClassSet(meta.names, meta.palette, losses.BODY_PART_CLASS_WEIGHTS)
