"""Sapiens2 task models (backbone + decode head), their outputs, and `build_model` from a config."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from sapiens2.backbone import VisionTransformer
from sapiens2.config import Sapiens2Config
from sapiens2.errors import ConfigError
from sapiens2.heads import DecodeHead, PointmapHead


@dataclass
class Sapiens2ModelOutput:
    """Final-normalized tokens (B, 1 + registers + patches, C) and the CLS token (B, C)."""

    last_hidden_state: Tensor
    pooler_output: Tensor


@dataclass
class Sapiens2BackboneOutput:
    """One feature map (B, C, h, w) per selected stage, and their CLS tokens (B, C) when requested."""

    feature_maps: tuple[Tensor, ...]
    cls_tokens: tuple[Tensor, ...] | None = None


@dataclass
class Sapiens2PoseEstimatorOutput:
    """Keypoint heatmaps (B, K, H/4, W/4) for 308 keypoints at the official resolution."""

    heatmaps: Tensor


@dataclass
class Sapiens2SemanticSegmenterOutput:
    """Per-class logits (B, num_labels, H, W)."""

    logits: Tensor


@dataclass
class Sapiens2NormalEstimatorOutput:
    """Raw (unnormalized) surface normals (B, 3, H, W)."""

    normals: Tensor


@dataclass
class Sapiens2PointmapEstimatorOutput:
    """Per-pixel XYZ (B, 3, H, W) and the canonical / actual focal length ratio (B, 1), if predicted."""

    pointmaps: Tensor
    scales: Tensor | None


@dataclass
class Sapiens2ImageMattingOutput:
    """Alpha matte (B, 1, H, W) and premultiplied RGB foreground (B, 3, H, W), both in [0, 1]."""

    alphas: Tensor
    foregrounds: Tensor


class Sapiens2Model(VisionTransformer):
    """The bare backbone: final-normalized tokens and the CLS token."""

    def __init__(self, config: Sapiens2Config) -> None:
        super().__init__(config)
        self.config = config

    def forward(self, pixel_values: Tensor) -> Sapiens2ModelOutput:
        tokens, _ = super().forward(pixel_values)
        return Sapiens2ModelOutput(last_hidden_state=tokens, pooler_output=tokens[:, 0])


class Sapiens2Backbone(VisionTransformer):
    """Feature extractor: patch features of the stages in `config.out_indices` (0 = embeddings)."""

    def __init__(self, config: Sapiens2Config) -> None:
        super().__init__(config)
        self.config = config

    def forward(self, pixel_values: Tensor, return_class_token: bool | None = None) -> Sapiens2BackboneOutput:
        """Feature maps, each passed through the final norm when `config.normalize_backbone_outputs`."""
        config = self.config
        if return_class_token is None:
            return_class_token = config.return_class_token
        x, rope, grid = self.embed(pixel_values)
        stages = {0: x} if 0 in config.out_indices else {}
        for index, block in enumerate(self.blocks[: max(config.out_indices)], start=1):
            x = block(x, rope)
            if index in config.out_indices:
                stages[index] = x
        selected = [stages[i] for i in config.out_indices]
        if config.normalize_backbone_outputs:
            selected = [self.ln1(h) for h in selected]
        if config.reshape_hidden_states:
            feature_maps = tuple(self.patch_features(h, grid).contiguous() for h in selected)
        else:
            feature_maps = tuple(h[:, self.num_prefix_tokens :] for h in selected)
        cls_tokens = tuple(h[:, 0] for h in selected) if return_class_token else None
        return Sapiens2BackboneOutput(feature_maps=feature_maps, cls_tokens=cls_tokens)


class DenseTaskModel(nn.Module):
    """A backbone (`backbone.*`) followed by a decode head (`decode_head.*`) on its last patch features."""

    predictor_name: str  # the head's final 1x1 conv, as named in the original checkpoints

    def __init__(self, config: Sapiens2Config) -> None:
        super().__init__()
        self.config = config
        self.backbone = VisionTransformer(config)
        self.decode_head = self.build_head(config)

    def build_head(self, config: Sapiens2Config) -> nn.Module:
        """The decode head for `config.head_config` with one output channel per label."""
        return DecodeHead(config.hidden_size, config.num_labels, config.head_config, self.predictor_name)

    def features(self, pixel_values: Tensor) -> Tensor:
        """Final-normalized patch features (B, C, H/patch, W/patch)."""
        tokens, grid = self.backbone(pixel_values)
        return self.backbone.patch_features(tokens, grid)


def flip_back(heatmaps: Tensor, flip_pairs: Tensor | Sequence[Sequence[int]]) -> Tensor:
    """Heatmaps of a horizontally flipped image mapped back: left/right channels swapped, width reversed."""
    pairs = torch.as_tensor(flip_pairs, dtype=torch.long, device=heatmaps.device).reshape(-1, 2)
    order = torch.arange(heatmaps.shape[1], device=heatmaps.device)
    order[pairs[:, 0]] = pairs[:, 1]
    order[pairs[:, 1]] = pairs[:, 0]
    return heatmaps.index_select(1, order).flip(-1)


class Sapiens2ForPoseEstimation(DenseTaskModel):
    """Top-down pose: one heatmap per keypoint at 1/4 of the input resolution."""

    predictor_name = "conv_pose"

    def forward(
        self, pixel_values: Tensor, flip_pairs: Tensor | Sequence[Sequence[int]] | None = None
    ) -> Sapiens2PoseEstimatorOutput:
        """Heatmaps; with `flip_pairs`, the input is taken as mirrored and the heatmaps are flipped back."""
        heatmaps = self.decode_head(self.features(pixel_values))
        if flip_pairs is not None:
            heatmaps = flip_back(heatmaps, flip_pairs)
        return Sapiens2PoseEstimatorOutput(heatmaps=heatmaps)


class Sapiens2ForSemanticSegmentation(DenseTaskModel):
    """Body-part segmentation logits at the input resolution."""

    predictor_name = "conv_seg"

    def forward(self, pixel_values: Tensor) -> Sapiens2SemanticSegmenterOutput:
        return Sapiens2SemanticSegmenterOutput(logits=self.decode_head(self.features(pixel_values)))


class Sapiens2ForNormalEstimation(DenseTaskModel):
    """Surface normals, raw (not unit length)."""

    predictor_name = "conv_normal"

    def forward(self, pixel_values: Tensor) -> Sapiens2NormalEstimatorOutput:
        return Sapiens2NormalEstimatorOutput(normals=self.decode_head(self.features(pixel_values)))


class Sapiens2ForPointmapEstimation(DenseTaskModel):
    """Per-pixel XYZ in canonical camera space, plus the focal-length scale when the head has that branch."""

    def build_head(self, config: Sapiens2Config) -> nn.Module:
        """The pointmap decoder with its focal-scale branch, if configured."""
        return PointmapHead(config.hidden_size, config.num_labels, config.head_config, config.hidden_act)

    def forward(self, pixel_values: Tensor) -> Sapiens2PointmapEstimatorOutput:
        pointmaps, scales = self.decode_head(self.features(pixel_values))
        return Sapiens2PointmapEstimatorOutput(pointmaps=pointmaps, scales=scales)


class Sapiens2ForImageMatting(DenseTaskModel):
    """Alpha matte and premultiplied foreground from one sigmoid-activated 4-channel map."""

    predictor_name = "conv_matting"

    def build_head(self, config: Sapiens2Config) -> nn.Module:
        """The decode head; matting needs exactly 4 labels (RGB + alpha)."""
        if config.num_labels != 4:
            raise ConfigError(f"id2label: matting predicts 4 channels (RGB + alpha), got {config.num_labels}")
        return super().build_head(config)

    def forward(self, pixel_values: Tensor) -> Sapiens2ImageMattingOutput:
        matting = self.decode_head(self.features(pixel_values)).sigmoid()
        return Sapiens2ImageMattingOutput(alphas=matting[:, 3:], foregrounds=matting[:, :3])


MODEL_CLASSES: dict[str, type[nn.Module]] = {
    cls.__name__: cls
    for cls in (
        Sapiens2Model,
        Sapiens2Backbone,
        Sapiens2ForPoseEstimation,
        Sapiens2ForSemanticSegmentation,
        Sapiens2ForNormalEstimation,
        Sapiens2ForPointmapEstimation,
        Sapiens2ForImageMatting,
    )
}


def build_model(config: Sapiens2Config) -> nn.Module:
    """The model class named by `config.architectures[0]`, built with placeholder weights, in eval mode.

    Cheap under `torch.device("meta")`; load weights with one strict `load_state_dict`.
    """
    cls = MODEL_CLASSES.get(config.architecture)
    if cls is None:
        raise ConfigError(
            f"architectures: {config.architecture!r} is not supported (supported: {sorted(MODEL_CLASSES)})"
        )
    return cls(config).eval()
