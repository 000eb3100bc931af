"""Decode heads: feature map (B, C, h, w) -> dense predictions, and the pointmap focal-scale branch.

Sub-module indices follow the original checkpoints, where every conv is followed by InstanceNorm and SiLU
(so `deconv_layers.0/.3/.6`, `conv_layers.0/.3`, `upsample_blocks.N.0`, `scale_final_layer.1/.3/.5`).
"""

from __future__ import annotations

from torch import Tensor, nn

from sapiens2.errors import ConfigError
from sapiens2.models.config import DECONV_PADDING, HeadConfig
from sapiens2.models.layers import ACTIVATIONS


def _norm_act(channels: int) -> list[nn.Module]:
    return [nn.InstanceNorm2d(channels), nn.SiLU()]


def _conv_stack(
    in_channels: int, out_channels: list[int], kernel_sizes: list[int], *, stride: int
) -> nn.Sequential:
    """Conv -> InstanceNorm -> SiLU for each output width, chained; padded by (kernel - 1) // 2, which keeps
    the size for odd kernels (and loses a pixel for even ones, as in the official heads)."""
    layers: list[nn.Module] = []
    for out, kernel in zip(out_channels, kernel_sizes, strict=True):
        padding = (kernel - 1) // 2
        layers += [nn.Conv2d(in_channels, out, kernel, stride=stride, padding=padding), *_norm_act(out)]
        in_channels = out
    return nn.Sequential(*layers)


def _deconv_stack(in_channels: int, out_channels: list[int], kernel_sizes: list[int]) -> nn.Sequential:
    """Stride-2 transposed conv (no bias) doubling the size -> InstanceNorm -> SiLU for each output width."""
    layers: list[nn.Module] = []
    for out, kernel in zip(out_channels, kernel_sizes, strict=True):
        padding, output_padding = DECONV_PADDING[kernel]
        deconv = nn.ConvTranspose2d(
            in_channels, out, kernel, stride=2, padding=padding, output_padding=output_padding, bias=False
        )
        layers += [deconv, *_norm_act(out)]
        in_channels = out
    return nn.Sequential(*layers)


def _pixel_shuffle_stack(in_channels: int, out_channels: list[int], kernel_sizes: list[int]) -> nn.Sequential:
    """Blocks of conv to 4x channels -> PixelShuffle(2) -> InstanceNorm -> SiLU."""
    blocks: list[nn.Module] = []
    for out, kernel in zip(out_channels, kernel_sizes, strict=True):
        conv = nn.Conv2d(in_channels, 4 * out, kernel, padding=(kernel - 1) // 2)
        blocks.append(nn.Sequential(conv, nn.PixelShuffle(2), *_norm_act(out)))
        in_channels = out
    return nn.Sequential(*blocks)


class DecodeHead(nn.Module):
    """Upsampling decoder ending in a 1x1 conv named `predictor_name` (conv_seg, conv_pose, ...)."""

    def __init__(
        self, in_channels: int, out_channels: int, head: HeadConfig | None, predictor_name: str
    ) -> None:
        super().__init__()
        if head is None or head.upsample_out_channels is None or head.conv_out_channels is None:
            raise ConfigError(
                f"head_config: a task model needs upsample_out_channels and conv_out_channels, got {head!r}"
            )
        stages: dict[str, nn.Module] = {}
        if head.use_pixel_shuffle:
            stages["input_conv"] = nn.Sequential(
                nn.Conv2d(in_channels, in_channels, 3, padding=1), *_norm_act(in_channels)
            )
            stages["upsample_blocks"] = _pixel_shuffle_stack(
                in_channels, head.upsample_out_channels, head.upsample_kernel_sizes
            )
        else:
            stages["deconv_layers"] = _deconv_stack(
                in_channels, head.upsample_out_channels, head.upsample_kernel_sizes
            )
        channels = head.upsample_out_channels[-1] if head.upsample_out_channels else in_channels
        stages["conv_layers"] = _conv_stack(
            channels, head.conv_out_channels, head.conv_kernel_sizes, stride=1
        )
        channels = head.conv_out_channels[-1] if head.conv_out_channels else channels
        stages[predictor_name] = nn.Conv2d(channels, out_channels, 1)
        for name, module in stages.items():
            self.add_module(name, module)
        self.stage_names = tuple(stages)

    def forward(self, features: Tensor) -> Tensor:
        for name in self.stage_names:
            features = getattr(self, name)(features)
        return features


class PointmapHead(DecodeHead):
    """Pointmap decoder plus, when configured, the branch regressing canonical / actual focal length."""

    def __init__(self, in_channels: int, out_channels: int, head: HeadConfig | None, activation: str) -> None:
        super().__init__(in_channels, out_channels, head, "conv_pointmap")
        if not head.has_scale_branch:
            self.scale_conv_layers = self.scale_final_layer = None
            return
        self.scale_conv_layers = _conv_stack(
            in_channels, head.scale_conv_out_channels, head.scale_conv_kernel_sizes, stride=2
        )
        act = ACTIVATIONS[activation]
        first, second = head.scale_final_hidden_sizes
        self.scale_final_layer = nn.Sequential(
            nn.Flatten(),
            nn.Linear(head.scale_final_input_size, first),
            act(),
            nn.Linear(first, second),
            act(),
            nn.Linear(second, 1),
        )

    def forward(self, features: Tensor) -> tuple[Tensor, Tensor | None]:
        """Pointmaps (B, 3, H, W) and scales (B, 1), or None without a scale branch."""
        pointmaps = super().forward(features)
        if self.scale_final_layer is None:
            return pointmaps, None
        return pointmaps, self.scale_final_layer(self.scale_conv_layers(features))
