"""The model kinds of the official checkpoints: the one place their names are written.

A kind is the word in an official repo id (`facebook/sapiens2-<kind>-<size>`) and in an original file name
(`sapiens2_<size>_<kind>.safetensors`). It fixes the model class, the labels, the decode head of each size
(from the official 1024x768 configs `sapiens/pose/configs/keypoints308/...` and
`sapiens/dense/configs/{seg,normal,pointmap}/...`) and whether photos are padded to the model's aspect.
The matting head is the official 1b one (`sapiens/dense/configs/matting/gss_p3m_metasim/
sapiens2_1b_matting_gss_p3m_metasim-1024x768.py` and `sapiens/dense/src/models/heads/matting_head.py`): the 1b
normal-head layout, pixel-shuffle upsampling, 4 sigmoid outputs (premultiplied RGB, then alpha).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from sapiens2.data import metadata
from sapiens2.errors import ConfigError

HUB_ORGANIZATION = "facebook"
# "1b-4k": the 1b backbone with the 4K hierarchical tokenizer, trained at 4096x3072.
BACKBONE_SIZES = ("0.1b", "0.4b", "0.8b", "1b", "1b-4k", "5b")


@dataclass(frozen=True, eq=False)
class ModelKind:
    """One kind of official checkpoint: its name, model class, labels, heads per size and input padding.

    `padded`: photos are resized with their aspect ratio kept and padded symmetrically with black, as the
    official normal and pointmap test pipelines do (NormalResizePadImage / PointmapResizePadImage, undone
    after inference); the other kinds stretch the photo to the model size (pose crops persons instead).
    """

    name: str
    architecture: str
    heads: Mapping[str, Mapping[str, Any]]  # size -> head_config; empty for the bare backbone
    labels: Callable[[], dict[str, Any]]  # id2label (and flip_pairs) of the head
    padded: bool = False

    @property
    def sizes(self) -> tuple[str, ...]:
        """Backbone sizes released with this kind of head."""
        return tuple(self.heads) if self.heads else BACKBONE_SIZES

    def repo_id(self, size: str) -> str:
        """The official Hub repo of this kind at `size`: facebook/sapiens2-<kind>-<size>."""
        return f"{HUB_ORGANIZATION}/sapiens2-{self.name}-{size}"

    def __repr__(self) -> str:
        return f"ModelKind({self.name!r})"


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


def _frozen(heads: dict[str, dict[str, Any]]) -> Mapping[str, Mapping[str, Any]]:
    return MappingProxyType({size: MappingProxyType(head) for size, head in heads.items()})


def _keypoint_labels() -> dict[str, Any]:
    keypoints = metadata.keypoints308()
    pairs = [list(pair) for pair in keypoints.flip_pairs]
    return {"id2label": dict(enumerate(keypoints.names)), "flip_pairs": pairs}


def _channel_labels(*names: str) -> Callable[[], dict[str, Any]]:
    return lambda: {"id2label": dict(enumerate(names))}


_POSE_HEAD = _deconv_head([1024, 768], [512, 512, 256])
_SEG_HEAD = _deconv_head([512, 256, 128, 64], [64, 64])
_NORMAL_HEAD = _shuffle_head([768, 512, 256, 128], [64, 32, 16])
_SCALE_BRANCH = {
    "scale_conv_out_channels": [1536, 512, 128],
    "scale_conv_kernel_sizes": [1, 1, 1],
    "scale_final_hidden_sizes": [512, 128],
}
_POINTMAP_HEAD = {**_shuffle_head([1536, 768, 512, 256], [64, 32, 16]), **_SCALE_BRANCH}

PRETRAIN = ModelKind("pretrain", "Sapiens2Model", _frozen({}), dict)
POSE = ModelKind(
    "pose",
    "Sapiens2ForPoseEstimation",
    _frozen(
        {
            "0.4b": _POSE_HEAD,
            "0.8b": _POSE_HEAD,
            "1b": _deconv_head([1536, 1024], [768, 512, 256]),
            "5b": _POSE_HEAD,
        }
    ),
    _keypoint_labels,
)
SEG = ModelKind(
    "seg",
    "Sapiens2ForSemanticSegmentation",
    _frozen({size: _SEG_HEAD for size in ("0.4b", "0.8b", "1b", "5b")}),
    lambda: {"id2label": dict(enumerate(metadata.body_parts().names))},
)
NORMAL = ModelKind(
    "normal",
    "Sapiens2ForNormalEstimation",
    _frozen(
        {
            **{size: _NORMAL_HEAD for size in ("0.4b", "0.8b", "1b")},
            "5b": _shuffle_head([1536, 768, 512, 256], [128, 64, 32]),
        }
    ),
    _channel_labels("x", "y", "z"),
    padded=True,
)
POINTMAP = ModelKind(
    "pointmap",
    "Sapiens2ForPointmapEstimation",
    _frozen(
        {
            **{size: _POINTMAP_HEAD for size in ("0.4b", "0.8b", "1b")},
            "5b": {**_shuffle_head([1536, 768, 768, 768], [128, 64, 32]), **_SCALE_BRANCH},
        }
    ),
    _channel_labels("x", "y", "z"),
    padded=True,
)
MATTING = ModelKind(
    "matting",
    "Sapiens2ForImageMatting",
    _frozen({"1b": _NORMAL_HEAD}),
    _channel_labels("r", "g", "b", "alpha"),
)

KINDS: Mapping[str, ModelKind] = MappingProxyType(
    {kind.name: kind for kind in (PRETRAIN, POSE, SEG, NORMAL, POINTMAP, MATTING)}
)


def get_kind(name: str) -> ModelKind:
    """The kind called `name` (case-insensitive), as written in repo ids and original file names."""
    try:
        return KINDS[name.lower()]
    except KeyError:
        raise ConfigError(f"unknown model kind {name!r}; expected one of {', '.join(KINDS)}") from None
