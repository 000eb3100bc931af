"""Building blocks of the Sapiens2 ViT: patch embedding, 2D RoPE, GQA attention, SwiGLU, transformer block."""

from __future__ import annotations

import math
from functools import lru_cache

import torch
import torch.nn.functional as F
from torch import Tensor, nn

# Activation modules by their config.json name (`hidden_act`).
ACTIVATIONS: dict[str, type[nn.Module]] = {
    "silu": nn.SiLU,
    "swish": nn.SiLU,
    "gelu": nn.GELU,
    "relu": nn.ReLU,
}


# PyTorch's oneDNN GEMM (the kernel it uses for fused linear layers) runs float32 inference faster than its
# default MKL path on CPUs where MKL picks slower kernels, such as AMD EPYC: 25-40% per GEMM on the benchmark
# machine. It has no autograd formula, so anything that needs gradients keeps F.linear.
_ONEDNN_LINEAR = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """F.linear, through oneDNN for float32 CPU tensors when no gradient is recorded."""
    if _ONEDNN_LINEAR and x.dtype == torch.float32 and x.device.type == "cpu" and not torch.is_grad_enabled():
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
    return F.linear(x, weight, bias)


class Linear(nn.Linear):
    """nn.Linear computed by `linear`."""

    def forward(self, x: Tensor) -> Tensor:
        return linear(x, self.weight, self.bias)


def scaled(x: Tensor, scale: Tensor) -> Tensor:
    """x * scale, written into x (a temporary) when autograd records nothing, to save memory."""
    if torch.is_grad_enabled() and (x.requires_grad or scale.requires_grad):
        return x * scale
    return x.mul_(scale)


def rms_normalize(x: Tensor, eps: float) -> Tensor:
    """x / sqrt(mean(x^2) + eps) over the last dimension, computed in float32, returned in x's dtype."""
    x32 = x.float()
    mean_square = torch.linalg.vector_norm(x32, dim=-1, keepdim=True).square().div(x.shape[-1])
    return (x32 * mean_square.add(eps).rsqrt()).to(x.dtype)


class RMSNorm(nn.Module):
    """Root-mean-square normalization over the last dimension with a learned scale."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        return scaled(rms_normalize(x, self.eps), self.weight)


class LayerScale(nn.Module):
    """Per-channel learned scaling of a residual branch."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        return x * self.weight


class PatchEmbed(nn.Module):
    """Non-overlapping patches to tokens: (B, C, H, W) -> (B, H/p * W/p, dim) and the patch grid size."""

    def __init__(self, in_channels: int, dim: int, patch_size: tuple[int, int]) -> None:
        super().__init__()
        self.projection = nn.Conv2d(in_channels, dim, kernel_size=patch_size, stride=patch_size)

    def forward(self, pixel_values: Tensor) -> tuple[Tensor, tuple[int, int]]:
        x = self.projection(pixel_values)
        grid = (x.shape[-2], x.shape[-1])
        return x.flatten(2).transpose(1, 2), grid


@lru_cache(maxsize=16)
def patch_coordinates(grid: tuple[int, int], device: torch.device) -> Tensor:
    """Patch centres (h * w, 2) as (y, x), each axis placed separately on [-1, 1]."""
    with torch.inference_mode(False):
        height, width = grid
        ys = torch.arange(0.5, height, dtype=torch.float32, device=device) / height
        xs = torch.arange(0.5, width, dtype=torch.float32, device=device) / width
        return 2.0 * torch.stack(torch.meshgrid(ys, xs, indexing="ij"), dim=-1).flatten(0, 1) - 1.0


def augment_coordinates(
    coords: Tensor, shift: float | None = None, jitter: float | None = None, rescale: float | None = None
) -> Tensor:
    """Training-time RoPE augmentation: coordinates (N, 2) shifted by U(-shift, shift) per axis, scaled by
    a log-uniform factor in [1/jitter, jitter] per axis and by one in [1/rescale, rescale] for both; each
    draw from torch's default generator, in that order."""
    if shift is not None:
        coords = coords + torch.empty(1, 2, device=coords.device).uniform_(-shift, shift)
    if jitter is not None:
        coords = (
            coords
            * torch.empty(1, 2, device=coords.device).uniform_(-math.log(jitter), math.log(jitter)).exp()
        )
    if rescale is not None:
        coords = (
            coords
            * torch.empty(1, device=coords.device).uniform_(-math.log(rescale), math.log(rescale)).exp()
        )
    return coords


def rope_tables_at(
    coords: Tensor, head_dim: int, theta: float, num_prefix: int, dtype: torch.dtype
) -> tuple[Tensor, Tensor]:
    """cos and signed-sin tables (tokens, 1, head_dim) of the 2D RoPE at patch coordinates (N, 2) (y, x);
    identity on the prefix tokens.

    Each quarter of the head channels rotates with one frequency of one axis, in the layout [y, x, y, x].
    """
    inv_freq = 1 / theta ** torch.arange(0, 1, 4 / head_dim, dtype=torch.float32, device=coords.device)
    angles = (2 * math.pi * coords[:, :, None] * inv_freq).flatten(1, 2).tile(2)
    cos, sin = angles.cos(), angles.sin()
    half = head_dim // 2
    # rotate_half(x) * sin == swap_halves(x) * [-sin, sin], so the sign lives in the table.
    sin = torch.cat((-sin[:, :half], sin[:, half:]), dim=-1)
    cos = torch.cat((cos.new_ones(num_prefix, head_dim), cos))
    sin = torch.cat((sin.new_zeros(num_prefix, head_dim), sin))
    return cos.to(dtype)[:, None], sin.to(dtype)[:, None]


@lru_cache(maxsize=16)
def rope_tables(
    grid: tuple[int, int],
    head_dim: int,
    theta: float,
    num_prefix: int,
    dtype: torch.dtype,
    device: torch.device,
) -> tuple[Tensor, Tensor]:
    """`rope_tables_at` the patch centres of `grid`, cached."""
    with torch.inference_mode(False):
        return rope_tables_at(patch_coordinates(grid, device), head_dim, theta, num_prefix, dtype)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate (B, tokens, heads, head_dim) queries or keys by the tables of `rope_tables`."""
    half = x.shape[-1] // 2
    swapped = torch.cat((x[..., half:], x[..., :half]), dim=-1)
    return torch.addcmul(x * cos, swapped, sin)


def stacked_projection(*linears: nn.Linear) -> tuple[Tensor, Tensor | None]:
    """Weight and bias of the linear layers as one layer whose outputs are theirs, concatenated."""
    weight = torch.cat([linear.weight for linear in linears])
    if all(linear.bias is None for linear in linears):
        return weight, None
    biases = [
        linear.weight.new_zeros(linear.out_features) if linear.bias is None else linear.bias
        for linear in linears
    ]
    return weight, torch.cat(biases)


def stacked_linear(x: Tensor, *linears: nn.Linear) -> Tensor:
    """The outputs of the linear layers on x, concatenated: one GEMM of the stacked weights, or, while
    autograd records, one per layer, so that no stacked copy of the weights is kept for the backward pass."""
    if torch.is_grad_enabled() and (x.requires_grad or any(layer.weight.requires_grad for layer in linears)):
        return torch.cat([F.linear(x, layer.weight, layer.bias) for layer in linears], dim=-1)
    return linear(x, *stacked_projection(*linears))


class Attention(nn.Module):
    """Multi-head self-attention with grouped key/value heads, QK RMSNorm and 2D RoPE on patch tokens.

    Without `layer_scale` the output is not scaled (no `gamma`); called without RoPE tables, no position
    is encoded (the 4K tokenizer's blocks).
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        num_kv_heads: int,
        *,
        qk_norm: bool = True,
        eps: float = 1e-6,
        query_bias: bool = True,
        key_bias: bool = True,
        value_bias: bool = True,
        proj_bias: bool = True,
        layer_scale: bool = True,
    ) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = dim // num_heads
        kv_dim = num_kv_heads * self.head_dim
        self.wq = Linear(dim, dim, bias=query_bias)
        self.wk = Linear(dim, kv_dim, bias=key_bias)
        self.wv = Linear(dim, kv_dim, bias=value_bias)
        self.q_norm = RMSNorm(self.head_dim, eps) if qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, eps) if qk_norm else None
        self.proj = Linear(dim, dim, bias=proj_bias)
        self.gamma = LayerScale(dim) if layer_scale else nn.Identity()

    def forward(self, x: Tensor, rope: tuple[Tensor, Tensor] | None) -> Tensor:
        batch, tokens, dim = x.shape
        heads, kv_heads = self.num_heads, self.num_kv_heads
        # q, k and v come from one GEMM, and q and k share their norm and RoPE ops: fewer, larger kernels.
        qkv = stacked_linear(x, self.wq, self.wk, self.wv)
        qkv = qkv.view(batch, tokens, heads + 2 * kv_heads, self.head_dim)
        qk, v = qkv.split((heads + kv_heads, kv_heads), dim=2)
        if self.q_norm is not None:
            scales = (self.q_norm.weight.expand(heads, -1), self.k_norm.weight.expand(kv_heads, -1))
            qk = scaled(rms_normalize(qk, self.q_norm.eps), torch.cat(scales))
        if rope is not None:
            qk = apply_rope(qk, *rope)
        q, k = qk.split((heads, kv_heads), dim=2)
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), enable_gqa=kv_heads != heads
        )
        return self.gamma(self.proj(out.transpose(1, 2).reshape(batch, tokens, dim)))


class SwiGLU(nn.Module):
    """Gated feed-forward: w3(act(x W1) * x W2) with W1 and W2 stored stacked as one `w12` projection."""

    def __init__(self, dim: int, hidden_dim: int, *, bias: bool = True, activation: str = "silu") -> None:
        super().__init__()
        self.w12 = Linear(dim, 2 * hidden_dim, bias=bias)
        self.w3 = Linear(hidden_dim, dim, bias=bias)
        self.act = ACTIVATIONS[activation]()

    def forward(self, x: Tensor) -> Tensor:
        gate, up = self.w12(x).chunk(2, dim=-1)
        return self.w3(scaled(self.act(gate), up))


class Block(nn.Module):
    """Pre-norm transformer block: x + gamma * attn(ln1(x)), then x + ffn(ln2(x))."""

    def __init__(self, attn: Attention, ffn: SwiGLU, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.ln1 = RMSNorm(dim, eps)
        self.attn = attn
        self.ln2 = RMSNorm(dim, eps)
        self.ffn = ffn

    def forward(self, x: Tensor, rope: tuple[Tensor, Tensor] | None) -> Tensor:
        x = x + self.attn(self.ln1(x), rope)
        return x + self.ffn(self.ln2(x))
