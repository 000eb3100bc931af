"""What training needs to know about each task, declared once per task: its dataset layout, samples, loss,
metric, labels and optimiser settings (`RECIPES`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from sapiens2.data import metadata
from sapiens2.data.metadata import body_parts
from sapiens2.errors import TrainingError
from sapiens2.models import losses
from sapiens2.models.config import Sapiens2Config
from sapiens2.models.kinds import ModelKind
from sapiens2.tasks.registry import Task, get_task, other_names
from sapiens2.training import datasets, metrics, optim, samples
from sapiens2.training.datasets import ClassSet, KeypointSet
from sapiens2.vision.processing import ProcessorSettings

Labels = KeypointSet | ClassSet | tuple[str, ...]


SamplesFactory = Callable[..., samples.TaskSamples]


@dataclass(frozen=True)
class Recipe:
    """How one task trains, as the official configs do: its dataset reader, its samples (model inputs and
    targets), the weighted terms of its loss, its validation metric and its labels.

    `samples(records, settings, labels, seed, sigma, augment, output_size)`; `loss(outputs, batch, labels)`;
    `metric(settings, labels)`; `checkpoint_labels(names, config)`: the labels a checkpoint's head predicts;
    `default_labels(channels)`: a new head's labels when the dataset names none (None: the dataset must).
    """

    read: Callable[[Path], tuple[list, Labels | None]]
    samples: SamplesFactory
    loss: Callable[[Any, dict[str, Tensor], Labels], dict[str, Tensor]]
    metric: Callable[[ProcessorSettings, Labels], metrics.Metric]
    checkpoint_labels: Callable[[tuple[str, ...], Sapiens2Config], Labels] = lambda names, config: names
    default_labels: Callable[[tuple[str, ...]], Labels | None] = lambda channels: channels
    label_noun: str = "classes"  # what the head's outputs are called in messages
    layer_decay: float = optim.OFFICIAL_LAYER_DECAY  # the 0.4b configs' layer-wise learning-rate decay
    max_grad_norm: float = optim.MAX_GRAD_NORM  # and their gradient clipping norm


@dataclass(frozen=True)
class TrainingTask:
    """One trainable task of the registry with its recipe."""

    task: Task
    recipe: Recipe

    @property
    def name(self) -> str:
        return self.task.name

    @property
    def kind(self) -> ModelKind:
        """The kind of checkpoint the task fine-tunes."""
        return self.task.kind

    @property
    def aliases(self) -> tuple[str, ...]:
        """Other names accepted on the command line: its checkpoints' (seg, normal, pointmap)."""
        return tuple(name for name in other_names() if other_names()[name] == self.name)

    @property
    def channels(self) -> tuple[str, ...]:
        """The head's output names of the official checkpoints."""
        return tuple(self.kind.labels()["id2label"].values())

    @property
    def layer_decay(self) -> float:
        return self.recipe.layer_decay

    @property
    def max_grad_norm(self) -> float:
        return self.recipe.max_grad_norm

    @property
    def label_noun(self) -> str:
        return self.recipe.label_noun

    def read(self, directory: Path) -> tuple[list, Labels | None]:
        """The dataset's records under `directory`, with the labels it names (None: it names none)."""
        return self.recipe.read(directory)

    def checkpoint_labels(self, config: Sapiens2Config) -> Labels:
        """The labels a checkpoint's head predicts, from its config."""
        names = tuple(config.id2label[index] for index in range(config.num_labels))
        return self.recipe.checkpoint_labels(names, config)

    def default_labels(self) -> Labels:
        """The labels of a new head when the dataset names none: the official ones."""
        labels = self.recipe.default_labels(self.channels)
        if labels is None:  # the readers of such datasets always give them
            raise TrainingError(f"{self.name} needs {self.label_noun} named by the dataset")
        return labels

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
        return self.recipe.samples(records, settings, labels, seed, sigma, augment, output_size)

    def loss_terms(self, outputs: Any, batch: dict[str, Tensor], labels: Labels) -> dict[str, Tensor]:
        """The official recipe's weighted terms for a batch."""
        return self.recipe.loss(outputs, batch, labels)

    def metric(self, settings: ProcessorSettings, labels: Labels) -> metrics.Metric:
        """The validation metric of the task."""
        return self.recipe.metric(settings, labels)


def _labelled(read: Callable[[Path], list]) -> Callable[[Path], tuple[list, None]]:
    """A reader of datasets that name no labels."""
    return lambda directory: (read(directory), None)


def _dense(kind: type[samples.TaskSamples]) -> SamplesFactory:
    """Samples of a dense task whose targets need no labels."""
    return lambda records, settings, labels, seed, sigma, augment, output_size: kind(
        records, settings, seed, augment
    )


def _segmentation_loss(outputs: Any, batch: dict[str, Tensor], labels: ClassSet) -> dict[str, Tensor]:
    weights = None if labels.class_weights is None else torch.tensor(labels.class_weights)
    weights = None if weights is None else weights.to(outputs.logits.device, torch.float32)
    return losses.segmentation_recipe(outputs.logits, batch["labels"], weights)


def _segmentation_classes(names: tuple[str, ...], config: Sapiens2Config) -> ClassSet:
    """The official body parts (with their palette and weights) when a head predicts them, else its own."""
    return (
        body_part_classes() if names == body_parts().names else ClassSet(names, metadata.palette(len(names)))
    )


# Each trainable task's recipe, by the registry's name (its checkpoints' names: `other_names`).
RECIPES: dict[str, Recipe] = {
    "pose": Recipe(
        read=datasets.read_pose,
        samples=lambda records, settings, labels, seed, sigma, augment, output_size: samples.PoseSamples(
            records, settings, labels, sigma, seed, augment, output_size
        ),
        loss=lambda outputs, batch, labels: losses.pose_recipe(
            outputs.heatmaps, batch["heatmaps"], batch["weights"]
        ),
        metric=lambda settings, labels: metrics.PoseMetric(settings.size),
        checkpoint_labels=lambda names, config: KeypointSet(names, tuple(config.flip_pairs or ()), ()),
        default_labels=lambda channels: None,
        label_noun="keypoints",
    ),
    "segment": Recipe(
        read=datasets.read_segmentation,
        samples=lambda records, settings, labels, seed, sigma, augment, output_size: (
            samples.SegmentationSamples(records, settings, labels, seed, augment)
        ),
        loss=_segmentation_loss,
        metric=lambda settings, labels: metrics.SegmentationMetric(labels.names),
        checkpoint_labels=_segmentation_classes,
        default_labels=lambda channels: body_part_classes(),
    ),
    "normals": Recipe(
        read=_labelled(datasets.read_normals),
        samples=_dense(samples.NormalSamples),
        loss=lambda outputs, batch, labels: losses.normal_recipe(
            outputs.normals, batch["normals"], batch["mask"]
        ),
        metric=lambda settings, labels: metrics.NormalMetric(),
    ),
    "depth": Recipe(
        read=_labelled(datasets.read_pointmaps),
        samples=_dense(samples.PointmapSamples),
        loss=lambda outputs, batch, labels: losses.pointmap_recipe(
            outputs.pointmaps,
            outputs.scales,
            batch["pointmaps"],
            batch["mask"],
            batch["intrinsics"],
            batch["scales"],
        ),
        metric=lambda settings, labels: metrics.PointmapMetric(),
    ),
    "matting": Recipe(
        read=_labelled(datasets.read_matting),
        samples=_dense(samples.MattingSamples),
        loss=lambda outputs, batch, labels: losses.matting_recipe(
            outputs.alphas, outputs.foregrounds, batch["labels"], batch["foreground_weights"]
        ),
        metric=lambda settings, labels: metrics.MattingMetric(),
        # The official matting config (1b) decays and clips differently from the 0.4b ones.
        layer_decay=optim.MATTING_LAYER_DECAY,
        max_grad_norm=optim.MATTING_MAX_GRAD_NORM,
    ),
}
TASKS: dict[str, TrainingTask] = {
    name: TrainingTask(get_task(name), recipe) for name, recipe in RECIPES.items()
}


def get_training_task(name: str) -> TrainingTask:
    """The trainable task called `name`: the registry's name, or its checkpoints' (seg, normal, pointmap)."""
    task = TASKS.get(other_names().get(name, name))
    if task is not None:
        return task
    names = ", ".join(
        f"{t.name}" + (f" ({', '.join(t.aliases)})" if t.aliases else "") for t in TASKS.values()
    )
    raise TrainingError(f"No trainable task {name!r}; choose one of {names}.")


def body_part_classes() -> ClassSet:
    """The official 29 body-part classes with their palette and the recipe's class weights."""
    meta = body_parts()
    return ClassSet(meta.names, meta.palette, losses.BODY_PART_CLASS_WEIGHTS)
