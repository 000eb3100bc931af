"""Tiny random Sapiens2 checkpoints written by transformers' `save_pretrained`, for tests.

Each tiny model keeps the official layout of its repo (`models.presets`: 308 keypoints with their names
and flip pairs, 29 body parts, deconv or pixel-shuffle heads with the official number of layers and kernel
sizes, the pointmap scale branch, GQA between full-attention blocks, 8 register tokens, QK norm) with
tiny widths (hidden 32, 3 blocks, head channels / 64), so that a checkpoint is a few hundred KB.

`image_size` stays the official 1024x768. It only matters to the pointmap scale branch, whose flattened
input size is fixed by it: a pointmap checkpoint accepts inputs whose 16-pixel patch grid reduces to 8x6
after three stride-2 convs, i.e. 913..1024 x 657..768 pixels (1024x768 being the processor default).
Pass `image_size` to write smaller pointmap checkpoints (e.g. 160x96 for a 10x6 patch grid).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import transformers

from sapiens2.models import presets
from sapiens2.vision.detector import Detections

SIZES = ("0.4b", "0.8b", "1b", "5b")
ALL_REPO_IDS: tuple[str, ...] = (
    "facebook/sapiens2-pretrain-0.1b",
    *(
        f"facebook/sapiens2-{task}-{size}"
        for task in ("pretrain", "pose", "seg", "normal", "pointmap")
        for size in SIZES
    ),
    "facebook/sapiens2-matting-1b",
)

TINY_BACKBONE: dict[str, Any] = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_attention_heads": 2,
    "num_first_full_attention_layers": 1,
    "num_last_full_attention_layers": 1,
}
_CHANNEL_LISTS = (
    "upsample_out_channels",
    "conv_out_channels",
    "scale_conv_out_channels",
    "scale_final_hidden_sizes",
)


def repo_task_size(repo_id: str) -> tuple[str, str]:
    """("pose", "1b") for "facebook/sapiens2-pose-1b"."""
    _, task, size = repo_id.split("/")[-1].split("-")
    return task, size


def tiny_config(
    task: str,
    size: str = "0.4b",
    *,
    num_labels: int | None = None,
    image_size: tuple[int, int] | None = None,
    **overrides: Any,
) -> dict[str, Any]:
    """transformers config dict of a tiny `task` model laid out like the official `size` one."""
    config = copy.deepcopy(presets.preset_config(size, task))
    config.update(TINY_BACKBONE)
    head = config.get("head_config")
    for key in _CHANNEL_LISTS:
        if head and head.get(key):
            head[key] = [max(4, channels // 64) for channels in head[key]]
    if num_labels is not None:
        config["id2label"] = {i: config.get("id2label", {}).get(i, f"LABEL_{i}") for i in range(num_labels)}
        if config.get("flip_pairs"):
            config["flip_pairs"] = [p for p in config["flip_pairs"] if max(p) < num_labels]
    if image_size is not None:
        config["image_size"] = list(image_size)
    config.update(overrides)
    return config


def randomize_constants(model: torch.nn.Module, generator: torch.Generator) -> None:
    """Add noise to every tensor that initialization left constant (norm scales, layer scales, biases)."""
    with torch.no_grad():
        for parameter in model.parameters():
            flat = parameter.flatten()
            if flat.numel() > 0 and bool((flat == flat[0]).all()):
                parameter.add_(0.2 * torch.randn(parameter.shape, generator=generator))


def write_transformers_checkpoint(directory: str | Path, config: dict[str, Any], *, seed: int = 0) -> Path:
    """Build the transformers model named by `config["architectures"][0]` with random weights and save it."""
    reference_config = transformers.Sapiens2Config(**{k: v for k, v in config.items() if k != "model_type"})
    torch.manual_seed(seed)
    model = getattr(transformers, config["architectures"][0])(reference_config).eval()
    randomize_constants(model, torch.Generator().manual_seed(seed))
    directory = Path(directory)
    model.save_pretrained(directory)
    return directory


def write_tiny_checkpoint(
    directory: str | Path,
    task: str,
    *,
    size: str = "0.4b",
    seed: int = 0,
    num_labels: int | None = None,
    image_size: tuple[int, int] | None = None,
    **overrides: Any,
) -> Path:
    """Write config.json + model.safetensors of a tiny random `task` model into `directory`."""
    config = tiny_config(task, size, num_labels=num_labels, image_size=image_size, **overrides)
    return write_transformers_checkpoint(directory, config, seed=seed)


def tiny_4k_config(image_size: tuple[int, int] = (256, 192)) -> dict[str, Any]:
    """Config dict of a tiny 4K backbone (the official 1b-4k layout: 4x4-window tokenizer, here 2 blocks).

    transformers has no 4K tokenizer, so this config is this package's own config.json format.
    """
    config = tiny_config("pretrain", "1b-4k", image_size=image_size)
    config["num_tokenizer_layers"] = 2
    return config


def write_tiny_4k_checkpoint(
    directory: str | Path,
    *,
    seed: int = 0,
    image_size: tuple[int, int] = (256, 192),
    file_name: str | None = None,
) -> Path:
    """Write a tiny random 4K backbone: config.json + model.safetensors, or with `file_name` only that weight
    file (an original checkpoint, configured by its name); returns the directory."""
    import json

    from safetensors.torch import save_file

    from sapiens2.models.config import Sapiens2Config
    from sapiens2.models.modeling import build_model

    config = tiny_4k_config(image_size)
    torch.manual_seed(seed)
    model = build_model(Sapiens2Config.from_dict(config))
    randomize_constants(model, torch.Generator().manual_seed(seed))
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    weights = {name: tensor.contiguous() for name, tensor in model.state_dict().items()}
    if file_name is not None:
        save_file(weights, directory / file_name)
        return directory
    (directory / "config.json").write_text(json.dumps(config))
    save_file(weights, directory / "model.safetensors")
    return directory


def write_tiny_mirror(root: str | Path, repo_ids: Iterable[str] = ALL_REPO_IDS, *, seed: int = 0) -> Path:
    """Write `<root>/<repo id>/` with a tiny checkpoint for each official repo id and, as the Hub repos hold
    one, the preprocessor_config.json that transformers writes for its task; returns `root`."""
    from sapiens2.models.kinds import get_kind

    root = Path(root)
    for repo_id in repo_ids:
        task, size = repo_task_size(repo_id)
        write_tiny_checkpoint(root / repo_id, task, size=size, seed=seed)
        processor = transformers.Sapiens2ImageProcessor(do_pad=get_kind(task).padded)
        processor.save_pretrained(root / repo_id)
    return root


def write_few_persons_yolo(path: str | Path) -> str:
    """Save a yolo11n .pt (built from its yaml, no download) that finds a few large persons, 2 to 4, in any
    photo; returns its path.

    Its last class and box layers are zeroed and biased: every anchor of the coarsest level scores
    'person' at 0.88 with the widest box the head can draw, so suppression keeps a few boxes clipped to
    the photo. Class 0 is named 'person', as the detector requires.
    """
    from ultralytics import YOLO

    torch.manual_seed(0)
    model = YOLO("yolo11n.yaml")
    head = model.model.model[-1]
    with torch.no_grad():
        for level, (box, score) in enumerate(zip(head.cv2, head.cv3, strict=True)):
            for layer in (box[-1], score[-1]):
                layer.weight.zero_()
                layer.bias.fill_(-9.0)
            box[-1].bias.view(4, head.reg_max)[:, -1] = 9.0
            score[-1].bias[0] = 2.0 if level == len(head.cv3) - 1 else -9.0
    model.model.names = {0: "person", **{i: f"class{i}" for i in range(1, 80)}}
    model.save(str(path))
    return str(path)


class CentreBox:
    """A person detector that finds one person, in the middle of every photo: for runs that test the Sapiens2
    side of a pipeline where ultralytics is not installed (the GPU image) or would cost more than the
    model under test (live benchmarks). The real detector is tested on its own."""

    def detect(self, image_rgb: np.ndarray) -> Detections:
        height, width = image_rgb.shape[:2]
        box = np.array([[width * 0.25, height * 0.1, width * 0.5, height * 0.8]], dtype=np.float32)
        return Detections(box, np.array([0.9], dtype=np.float32), found=1)


def balance_background(runtime: Any, photo: Any) -> np.ndarray:
    """Shift the tiny body-part model's background logit (of the segment task's default checkpoint, in
    `runtime`'s cache) so that about half of `photo` is background; its labels of the photo afterwards."""
    from sapiens2.models.kinds import SEG
    from sapiens2.tasks import get_task
    from sapiens2.vision.processing import preprocess

    repo_id = get_task("segment").repo_id(None)
    model = runtime.model(repo_id)
    inputs = preprocess([photo.model_rgb], runtime.settings(repo_id, SEG))
    logits = runtime.forward(model, inputs).logits[0]
    margin = logits[1:].amax(dim=0) - logits[0]
    with torch.no_grad():
        model.decode_head.conv_seg.bias[0] += margin.median()
    return runtime.run("segment", photo).prediction.labels
