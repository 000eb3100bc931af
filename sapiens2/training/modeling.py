"""The model to fine-tune: loaded from `--model`, its head fitted to the dataset's labels, and the config
that its checkpoints are saved with.

`--model` names a checkpoint of the task being trained (fine-tuned as it is), or a pretrained backbone
(`facebook/sapiens2-pretrain-*`), which gets the official head of its size, freshly initialized, as the
official recipes start. When the dataset's keypoints or classes differ in number from the checkpoint's,
only the last layer is re-initialized, and only with `--new-labels`.
"""

from __future__ import annotations

import copy
import json
import logging
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from sapiens2.errors import TrainingError
from sapiens2.models import presets
from sapiens2.models.config import Sapiens2Config
from sapiens2.models.hub import from_pretrained, resolve_checkpoint
from sapiens2.models.kinds import PRETRAIN
from sapiens2.models.modeling import MODEL_CLASSES, DenseTaskModel, build_model
from sapiens2.training.datasets import ClassSet, KeypointSet
from sapiens2.training.tasks import Labels, TrainingTask

log = logging.getLogger("sapiens2.train")


@dataclass
class TrainableModel:
    """A task model in training mode (float32, CPU), the labels its head predicts, and its config dict."""

    model: nn.Module
    labels: Labels
    config: dict[str, Any]


def source_config(source: str) -> dict[str, Any]:
    """The config dict of a checkpoint (its config.json, or the preset of an original file's name)."""
    checkpoint = resolve_checkpoint(source)
    if checkpoint.config_path is None:
        return presets.config_for_checkpoint_name(checkpoint.weight_paths[0])
    return json.loads(checkpoint.config_path.read_text())


def load_trainable(
    task: TrainingTask, source: str, dataset_labels: Labels | None, new_labels: bool, seed: int
) -> TrainableModel:
    """The model of `source` ready to fine-tune on a dataset with `dataset_labels`."""
    config = source_config(source)
    architecture = (config.get("architectures") or [PRETRAIN.architecture])[0]
    torch.manual_seed(seed)  # a new head or last layer starts the same in every process
    if is_backbone(architecture):
        return _from_backbone(task, source, config, dataset_labels)
    if architecture != task.kind.architecture:
        example = task.kind.repo_id(task.kind.sizes[0])
        raise TrainingError(
            f"--model {source} is a {architecture} checkpoint; training {task.name} needs a "
            f"{task.kind.architecture} checkpoint (e.g. {example}) or a pretrained backbone "
            f"({PRETRAIN.repo_id('0.4b')})"
        )
    model = from_pretrained(source, device="cpu", dtype=torch.float32)
    for parameter in model.parameters():  # weights may be memory-mapped from the file: train on a copy
        parameter.data = parameter.data.clone()
    labels = task.checkpoint_labels(model.config)
    if dataset_labels is not None and _count(dataset_labels) != _count(labels):
        what = task.label_noun
        if not new_labels:
            raise TrainingError(
                f"The dataset has {_count(dataset_labels)} {what} but --model {source} predicts "
                f"{_count(labels)}. Pass --new-labels to train a new last layer for the dataset's {what} "
                "(the rest of the model is kept)."
            )
        _replace_predictor(model, _count(dataset_labels))
        log.info(
            "The last layer was re-initialized for %d %s (the checkpoint had %d).",
            _count(dataset_labels),
            what,
            _count(labels),
        )
    if dataset_labels is not None:
        labels = dataset_labels
    return TrainableModel(model.train(), labels, labelled_config(config, task, labels))


def _from_backbone(
    task: TrainingTask, source: str, config: dict[str, Any], dataset_labels: Labels | None
) -> TrainableModel:
    """A task model whose backbone is the pretrained one and whose head is new, of the official layout of
    that size (of the largest size for a kind not released at that size)."""
    size = backbone_size(config)
    heads = task.kind.heads
    head = heads.get(size) or heads[task.kind.sizes[-1]]
    labels = dataset_labels if dataset_labels is not None else task.default_labels()
    task_config = copy.deepcopy(config)
    task_config.update(architectures=[task.kind.architecture], head_config=copy.deepcopy(dict(head)))
    task_config.pop("out_indices", None)
    task_config.pop("out_features", None)
    task_config = labelled_config(task_config, task, labels)
    model = build_model(Sapiens2Config.from_dict(task_config))
    init_head(model.decode_head)
    backbone = from_pretrained(source, device="cpu", dtype=torch.float32)
    model.backbone.load_state_dict({name: value.clone() for name, value in backbone.state_dict().items()})
    log.info(
        "New %s head (the official %s layout) on the pretrained backbone of %s.", task.name, size, source
    )
    return TrainableModel(model.train(), labels, task_config)


def is_backbone(architecture: str) -> bool:
    """Whether a model class name is a bare backbone (no decode head)."""
    model_class = MODEL_CLASSES.get(architecture)
    return model_class is not None and not issubclass(model_class, DenseTaskModel)


def backbone_size(config: dict[str, Any]) -> str:
    """The official size (0.4b, 1b, ...) whose backbone has this config's width and depth, else 0.4b."""
    for size, fields in presets.BACKBONES.items():
        if (
            config.get("hidden_size") == fields["hidden_size"]
            and config.get("num_hidden_layers") == fields["num_hidden_layers"]
        ):
            return size
    return "0.4b"


def init_head(module: nn.Module) -> None:
    """The official head initialization: Kaiming-normal convs (fan out) and linears (fan in), zero biases."""
    for layer in module.modules():
        if isinstance(layer, (nn.Conv2d, nn.ConvTranspose2d)):
            nn.init.kaiming_normal_(layer.weight, mode="fan_out", nonlinearity="relu")
        elif isinstance(layer, nn.Linear):
            nn.init.kaiming_normal_(layer.weight, mode="fan_in", nonlinearity="linear")
        else:
            continue
        if layer.bias is not None:
            nn.init.zeros_(layer.bias)


def _replace_predictor(model: nn.Module, count: int) -> None:
    """A new, initialized last 1x1 conv with `count` outputs."""
    head = model.decode_head
    name = head.stage_names[-1]
    old = getattr(head, name)
    new = nn.Conv2d(old.in_channels, count, 1)
    init_head(new)
    setattr(head, name, new)
    model.config.id2label = {index: f"LABEL_{index}" for index in range(count)}


def _count(labels: Labels) -> int:
    return len(labels) if isinstance(labels, tuple) else len(labels.names)


def labelled_config(config: dict[str, Any], task: TrainingTask, labels: Labels) -> dict[str, Any]:
    """`config` with id2label / label2id (and flip pairs and skeleton for pose, palette for segmentation)."""
    config = copy.deepcopy(config)
    names = labels if isinstance(labels, tuple) else labels.names
    config["id2label"] = {str(index): name for index, name in enumerate(names)}
    config["label2id"] = {name: index for index, name in enumerate(names)}
    config.pop("num_labels", None)
    config["model_type"] = "sapiens2"
    if isinstance(labels, KeypointSet):
        config["flip_pairs"] = [list(pair) for pair in labels.flip_pairs] or None
        if labels.skeleton:
            config["skeleton"] = [list(link) for link in labels.skeleton]
    if isinstance(labels, ClassSet):
        config["palette"] = [list(colour) for colour in labels.palette]
    return config
