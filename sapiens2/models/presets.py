"""Built-in configs for bare original checkpoints such as `sapiens2_0.4b_pose.safetensors`.

Backbone sizes follow the official `Sapiens2.arch_zoo`; heads and labels come from the model kinds
(`models.kinds`). The 4K backbone (`sapiens2_1b_4k_pretrain.safetensors`, size "1b-4k") is the 1b one with
the hierarchical tokenizer (`use_tokenizer`, 4x4 windows, the 1b arch's 4 tokenizer layers), trained at
4096x3072.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

from sapiens2.errors import ConfigError
from sapiens2.models.kinds import BACKBONE_SIZES, KINDS

IMAGE_SIZE = [1024, 768]

_BACKBONE_FIELDS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")
# Official arch zoo: width, blocks, heads, SwiGLU width; the middle blocks use heads // 2 key/value heads.
BACKBONES: dict[str, dict[str, int]] = {
    size: dict(zip(_BACKBONE_FIELDS, values, strict=True))
    for size, values in zip(
        BACKBONE_SIZES,
        [
            (768, 12, 12, 3072),
            (1024, 24, 16, 4096),
            (1280, 32, 16, 5120),
            (1536, 40, 24, 6144),
            (1536, 40, 24, 6144),
            (2432, 56, 32, 9728),
        ],
        strict=True,
    )
}
# What the 4K variant adds to its backbone's fields.
VARIANTS: dict[str, dict[str, Any]] = {
    "1b-4k": {"use_tokenizer": True, "window_size": 4, "num_tokenizer_layers": 4, "image_size": [4096, 3072]},
}

_NAME = re.compile(
    r"sapiens2_(?P<size>\d+(?:\.\d+)?b(?:_4k)?)_(?P<kind>[a-z0-9]+)(?:[_.-].*)?", re.IGNORECASE
)


def available() -> list[tuple[str, str]]:
    """Every (size, kind) pair with a built-in preset."""
    return [(size, kind.name) for kind in KINDS.values() for size in kind.sizes]


def preset_config(size: str, kind: str) -> dict[str, Any]:
    """A transformers-style config dict for the official model of `kind` (e.g. "seg") at backbone `size`."""
    size = size.lower()
    model_kind = KINDS.get(kind.lower())
    if model_kind is None or size not in BACKBONES or size not in model_kind.sizes:
        known = ", ".join(f"{s} {k}" for s, k in available())
        raise ConfigError(f"no built-in preset for Sapiens2 {size} {kind} (known: {known})")
    backbone = BACKBONES[size]
    config: dict[str, Any] = {
        "architectures": [model_kind.architecture],
        "model_type": "sapiens2",
        **backbone,
        "num_key_value_attention_heads": backbone["num_attention_heads"] // 2,
        "num_first_full_attention_layers": 8,
        "num_last_full_attention_layers": 8,
        "num_register_tokens": 8,
        "image_size": list(IMAGE_SIZE),
        "patch_size": 16,
        **VARIANTS.get(size, {}),
    }
    if model_kind.heads:
        config["head_config"] = copy.deepcopy(dict(model_kind.heads[size]))
        config.update(model_kind.labels())
    return config


def parse_checkpoint_name(path: str | Path) -> tuple[str, str]:
    """The (size, kind) named by an original file: `sapiens2_1b_seg.safetensors` -> ("1b", "seg"),
    `sapiens2_1b_4k_pretrain.safetensors` -> ("1b-4k", "pretrain")."""
    match = _NAME.fullmatch(Path(path).name)
    if match is None:
        raise ConfigError(
            f"{Path(path).name}: cannot tell the model from the file name; expected sapiens2_<size>_<kind>"
            ".safetensors (e.g. sapiens2_0.4b_pose.safetensors) or a directory with config.json"
        )
    return match["size"].lower().replace("_", "-"), match["kind"].lower()


def original_file_name(repo_id: str) -> str | None:
    """The original checkpoint file an official repo holds when it has no config.json:
    facebook/sapiens2-pretrain-1b-4k -> sapiens2_1b_4k_pretrain.safetensors; None for other repo ids."""
    kind, _, size = repo_id.rsplit("/", 1)[-1].removeprefix("sapiens2-").partition("-")
    if (size, kind) not in available():
        return None
    return f"sapiens2_{size.replace('-', '_')}_{kind}.safetensors"


def config_for_checkpoint_name(path: str | Path) -> dict[str, Any]:
    """The built-in config dict for an original checkpoint file, chosen by its name."""
    return preset_config(*parse_checkpoint_name(path))
