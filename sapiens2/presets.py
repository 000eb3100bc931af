"""Built-in configs for bare original checkpoints such as `sapiens2_0.4b_pose.safetensors`.

Backbone sizes follow the official `Sapiens2.arch_zoo`; head layouts follow the official 1024x768 configs
`sapiens/pose/configs/keypoints308/...` and `sapiens/dense/configs/{seg,normal,pointmap}/...`.
The official repository has no matting model: the matting head below is an assumption (the 1b normal-head
layout with 4 output channels, pixel-shuffle upsampling as transformers describes `Sapiens2ForImageMatting`).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from sapiens2 import metadata
from sapiens2.errors import ConfigError

IMAGE_SIZE = [1024, 768]

_BACKBONE_FIELDS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")
# Official arch zoo: width, blocks, heads, SwiGLU width; the middle blocks use heads // 2 key/value heads.
BACKBONES: dict[str, dict[str, int]] = {
    size: dict(zip(_BACKBONE_FIELDS, values, strict=True))
    for size, values in {
        "0.1b": (768, 12, 12, 3072),
        "0.4b": (1024, 24, 16, 4096),
        "0.8b": (1280, 32, 16, 5120),
        "1b": (1536, 40, 24, 6144),
        "5b": (2432, 56, 32, 9728),
    }.items()
}

ARCHITECTURES = {
    "pretrain": "Sapiens2Model",
    "pose": "Sapiens2ForPoseEstimation",
    "seg": "Sapiens2ForSemanticSegmentation",
    "normal": "Sapiens2ForNormalEstimation",
    "pointmap": "Sapiens2ForPointmapEstimation",
    "matting": "Sapiens2ForImageMatting",
}


def _deconv_head(upsample: list[int], conv: list[int]) -> dict[str, Any]:
    """Transposed-conv head (pose, seg): 4x4 stride-2 upsampling, then 1x1 convs."""
    return {
        "upsample_out_channels": upsample,
        "upsample_kernel_sizes": [4] * len(upsample),
        "conv_out_channels": conv,
        "conv_kernel_sizes": [1] * len(conv),
    }


def _shuffle_head(upsample: list[int], conv: list[int]) -> dict[str, Any]:
    """Pixel-shuffle head (normal, pointmap, matting): 3x3 convs before each 2x shuffle, then 3x3 convs."""
    return {
        "use_pixel_shuffle": True,
        "upsample_out_channels": upsample,
        "upsample_kernel_sizes": [3] * len(upsample),
        "conv_out_channels": conv,
        "conv_kernel_sizes": [3] * len(conv),
    }


_POSE = _deconv_head([1024, 768], [512, 512, 256])
_SEG = _deconv_head([512, 256, 128, 64], [64, 64])
_NORMAL = _shuffle_head([768, 512, 256, 128], [64, 32, 16])
_SCALE = {
    "scale_conv_out_channels": [1536, 512, 128],
    "scale_conv_kernel_sizes": [1, 1, 1],
    "scale_final_hidden_sizes": [512, 128],
}
_POINTMAP = {**_shuffle_head([1536, 768, 512, 256], [64, 32, 16]), **_SCALE}

# Decode heads by (task, size); "pretrain" has no head and exists for every backbone size.
HEADS: dict[tuple[str, str], dict[str, Any]] = {
    ("pose", "0.4b"): _POSE,
    ("pose", "0.8b"): _POSE,
    ("pose", "1b"): _deconv_head([1536, 1024], [768, 512, 256]),
    ("pose", "5b"): _POSE,
    **{("seg", size): _SEG for size in ("0.4b", "0.8b", "1b", "5b")},
    **{("normal", size): _NORMAL for size in ("0.4b", "0.8b", "1b")},
    ("normal", "5b"): _shuffle_head([1536, 768, 512, 256], [128, 64, 32]),
    **{("pointmap", size): _POINTMAP for size in ("0.4b", "0.8b", "1b")},
    ("pointmap", "5b"): {**_shuffle_head([1536, 768, 768, 768], [128, 64, 32]), **_SCALE},
    ("matting", "1b"): _NORMAL,
}

_NAME = re.compile(r"sapiens2_(?P<size>\d+(?:\.\d+)?b)_(?P<task>[a-z0-9]+)(?:[_.-].*)?", re.IGNORECASE)


def _labels(task: str) -> dict[str, Any]:
    """id2label (and flip pairs for pose) of a task's head."""
    if task == "pose":
        keypoints = metadata.keypoints308()
        pairs = [list(pair) for pair in keypoints.flip_pairs]
        return {"id2label": dict(enumerate(keypoints.names)), "flip_pairs": pairs}
    if task == "seg":
        return {"id2label": dict(enumerate(metadata.body_parts().names))}
    channels = {"normal": ["x", "y", "z"], "pointmap": ["x", "y", "z"], "matting": ["r", "g", "b", "alpha"]}
    return {"id2label": dict(enumerate(channels[task]))}


def available() -> list[tuple[str, str]]:
    """Every (size, task) pair with a built-in preset."""
    return [(size, "pretrain") for size in BACKBONES] + [(size, task) for task, size in HEADS]


def preset_config(size: str, task: str) -> dict[str, Any]:
    """A transformers-style config dict for the official `task` model of backbone `size`."""
    size, task = size.lower(), task.lower()
    if size not in BACKBONES or (task != "pretrain" and (task, size) not in HEADS):
        known = ", ".join(f"{s} {t}" for s, t in available())
        raise ConfigError(f"no built-in preset for Sapiens2 {size} {task} (known: {known})")
    backbone = BACKBONES[size]
    config: dict[str, Any] = {
        "architectures": [ARCHITECTURES[task]],
        "model_type": "sapiens2",
        **backbone,
        "num_key_value_attention_heads": backbone["num_attention_heads"] // 2,
        "num_first_full_attention_layers": 8,
        "num_last_full_attention_layers": 8,
        "num_register_tokens": 8,
        "image_size": list(IMAGE_SIZE),
        "patch_size": 16,
    }
    if task != "pretrain":
        config["head_config"] = dict(HEADS[task, size])
        config.update(_labels(task))
    return config


def parse_checkpoint_name(path: str | Path) -> tuple[str, str]:
    """The (size, task) named by an original file: `sapiens2_1b_seg.safetensors` -> ("1b", "seg")."""
    match = _NAME.fullmatch(Path(path).name)
    if match is None:
        raise ConfigError(
            f"{Path(path).name}: cannot tell the model from the file name; expected sapiens2_<size>_<task>"
            ".safetensors (e.g. sapiens2_0.4b_pose.safetensors) or a directory with config.json"
        )
    return match["size"].lower(), match["task"].lower()


def config_for_checkpoint_name(path: str | Path) -> dict[str, Any]:
    """The built-in config dict for an original checkpoint file, chosen by its name."""
    return preset_config(*parse_checkpoint_name(path))
