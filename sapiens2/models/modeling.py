"""Sapiens2 task models (backbone + decode head), their outputs, and `build_model` from a config."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from sapiens2.errors import ConfigError
from sapiens2.models import losses
from sapiens2.models.backbone import VisionTransformer
from sapiens2.models.config import Sapiens2Config
from sapiens2.models.heads import DecodeHead, PointmapHead


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
    """Keypoint heatmaps (B, K, H/4, W/4) for 308 keypoints at the official resolution; the loss when
    labels were given."""

    heatmaps: Tensor
    loss: Tensor | None = None


@dataclass
class Sapiens2SemanticSegmenterOutput:
    """Per-class logits (B, num_labels, H, W); the loss when labels were given."""

    logits: Tensor
    loss: Tensor | None = None


@dataclass
class Sapiens2NormalEstimatorOutput:
    """Raw (unnormalized) surface normals (B, 3, H, W); the loss when labels were given."""

    normals: Tensor
    loss: Tensor | None = None


@dataclass
class Sapiens2PointmapEstimatorOutput:
    """Per-pixel XYZ (B, 3, H, W) and the canonical / actual focal length ratio (B, 1), if predicted; the
    loss when labels were given."""

    pointmaps: Tensor
    scales: Tensor | None
    loss: Tensor | None = None


@dataclass
class Sapiens2ImageMattingOutput:
    """Alpha matte (B, 1, H, W) and premultiplied RGB foreground (B, 3, H, W), both in [0, 1]; the loss when
    labels were given."""

    alphas: Tensor
    foregrounds: Tensor
    loss: Tensor | None = None


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
        with self.fastest_kernels(x, rope):
            for index in range(max(config.out_indices)):
                x = self.run_block(index, x, rope)
                if index + 1 in config.out_indices:
                    stages[index + 1] = x
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
        self,
        pixel_values: Tensor,
        flip_pairs: Tensor | Sequence[Sequence[int]] | None = None,
        labels: Tensor | None = None,
        label_weights: Tensor | None = None,
    ) -> Sapiens2PoseEstimatorOutput:
        """Heatmaps; with `flip_pairs`, the input is taken as mirrored and the heatmaps are flipped back.

        With target heatmaps `labels` (B, K, h, w), the loss is their masked MSE with `label_weights`
        (visibility, broadcastable to the labels: (B, K, 1, 1) or (B, K, h, w)).
        """
        heatmaps = self.decode_head(self.features(pixel_values))
        if flip_pairs is not None:
            heatmaps = flip_back(heatmaps, flip_pairs)
        loss = None if labels is None else losses.pose_loss(heatmaps, labels, label_weights)
        return Sapiens2PoseEstimatorOutput(heatmaps=heatmaps, loss=loss)


class Sapiens2ForSemanticSegmentation(DenseTaskModel):
    """Body-part segmentation logits at the input resolution."""

    predictor_name = "conv_seg"

    def forward(self, pixel_values: Tensor, labels: Tensor | None = None) -> Sapiens2SemanticSegmenterOutput:
        """Logits; with class ids `labels` (B, H, W), the cross-entropy of the logits upsampled to them, the
        label `config.semantic_loss_ignore_index` left out."""
        if labels is not None and self.config.num_labels == 1:
            raise ValueError("The number of labels should be greater than one")
        logits = self.decode_head(self.features(pixel_values))
        loss = None
        if labels is not None:
            loss = losses.segmentation_loss(logits, labels, self.config.semantic_loss_ignore_index)
        return Sapiens2SemanticSegmenterOutput(logits=logits, loss=loss)


class Sapiens2ForNormalEstimation(DenseTaskModel):
    """Surface normals, raw (not unit length)."""

    predictor_name = "conv_normal"

    def forward(
        self, pixel_values: Tensor, labels: Tensor | None = None, label_weights: Tensor | None = None
    ) -> Sapiens2NormalEstimatorOutput:
        """Normals; with target normals `labels` (B, 3, H, W), the official recipe's loss over the labelled
        pixels `label_weights` (B, 1, H, W) (default: where the labels are finite and not zero)."""
        normals = self.decode_head(self.features(pixel_values))
        loss = None
        if labels is not None:
            mask = _label_mask(labels, label_weights, labels.norm(dim=1, keepdim=True) > 0)
            targets = torch.where(mask > 0, F.normalize(labels.float(), dim=1), 0)
            loss = _total(losses.normal_recipe(normals, targets, mask))
        return Sapiens2NormalEstimatorOutput(normals=normals, loss=loss)


class Sapiens2ForPointmapEstimation(DenseTaskModel):
    """Per-pixel XYZ in canonical camera space, plus the focal-length scale when the head has that branch."""

    def build_head(self, config: Sapiens2Config) -> nn.Module:
        """The pointmap decoder with its focal-scale branch, if configured."""
        return PointmapHead(config.hidden_size, config.num_labels, config.head_config, config.hidden_act)

    def forward(
        self,
        pixel_values: Tensor,
        labels: Tensor | None = None,
        label_weights: Tensor | None = None,
        intrinsics: Tensor | None = None,
        scale_labels: Tensor | None = None,
    ) -> Sapiens2PointmapEstimatorOutput:
        """Pointmaps and scales; with canonical target pointmaps `labels` (B, 3, H, W), the official recipe's
        loss over the labelled pixels `label_weights` (B, 1, H, W) (default: finite labels with Z > 0).

        `intrinsics` (B, 3, 3) are the camera matrices of the labels' pixels (default: fitted to the labels);
        `scale_labels` (B, 1) the canonical / actual focal length ratios (default: 768 / fx).
        """
        pointmaps, scales = self.decode_head(self.features(pixel_values))
        loss = None
        if labels is not None:
            mask = _label_mask(labels, label_weights, labels[:, 2:] > 0)
            targets = torch.where(mask > 0, labels.float(), 0)
            if intrinsics is None:
                intrinsics = losses.fit_intrinsics(targets, mask)
            if scale_labels is None:
                scale_labels = losses.CANONICAL_FOCAL_LENGTH / intrinsics[:, 0, 0:1]
            loss = _total(losses.pointmap_recipe(pointmaps, scales, targets, mask, intrinsics, scale_labels))
        return Sapiens2PointmapEstimatorOutput(pointmaps=pointmaps, scales=scales, loss=loss)


class Sapiens2ForImageMatting(DenseTaskModel):
    """Alpha matte and premultiplied foreground from one sigmoid-activated 4-channel map."""

    predictor_name = "conv_matting"

    def build_head(self, config: Sapiens2Config) -> nn.Module:
        """The decode head; matting needs exactly 4 labels (RGB + alpha)."""
        if config.num_labels != 4:
            raise ConfigError(f"id2label: matting predicts 4 channels (RGB + alpha), got {config.num_labels}")
        return super().build_head(config)

    def forward(
        self, pixel_values: Tensor, labels: Tensor | None = None, label_weights: Tensor | None = None
    ) -> Sapiens2ImageMattingOutput:
        """Alphas and foregrounds; with `labels` (B, 4, H, W), premultiplied RGB foreground then alpha in
        [0, 1], the loss of `losses.matting_recipe`, its foreground terms over the pixels of `label_weights`
        (B, 1, H, W) > 0 (all without it)."""
        matting = self.decode_head(self.features(pixel_values)).sigmoid()
        alphas, foregrounds = matting[:, 3:], matting[:, :3]
        loss = None
        if labels is not None:
            loss = _total(losses.matting_recipe(alphas, foregrounds, labels.float(), label_weights))
        return Sapiens2ImageMattingOutput(alphas=alphas, foregrounds=foregrounds, loss=loss)


def _label_mask(labels: Tensor, label_weights: Tensor | None, default: Tensor) -> Tensor:
    """The float mask (B, 1, H, W) of labelled pixels: `label_weights`, else `default`; never where a label
    is not finite."""
    mask = default if label_weights is None else label_weights > 0
    return (mask & labels.isfinite().all(dim=1, keepdim=True)).float()


def _total(terms: dict[str, Tensor]) -> Tensor:
    """The sum of a recipe's weighted terms."""
    return torch.stack(list(terms.values())).sum()


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
