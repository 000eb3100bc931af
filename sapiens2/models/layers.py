"""Building blocks of the Sapiens2 ViT: patch embedding, 2D RoPE, GQA attention, SwiGLU, transformer block."""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import lru_cache

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from sapiens2.models import kernels

# Activation modules by their config.json name (`hidden_act`).
ACTIVATIONS: dict[str, type[nn.Module]] = {
    "silu": nn.SiLU,
    "swish": nn.SiLU,
    "gelu": nn.GELU,
    "relu": nn.ReLU,
}


# PyTorch's oneDNN GEMM (the kernel it uses for fused linear layers) applies an activation, or a product or
# sum with a same-shaped tensor, to the GEMM's output while it is in cache, which saves a pass over memory.
# Whether it beats PyTorch's default path (MKL for float32) depends on the CPU: it won on AVX-512 machines and
# lost on an AVX2 one, so each model's forward times both on its first call (`kernels`, `gemm_choice`). It
# has no autograd formula, so anything that records gradients keeps F.linear.
_ONEDNN_LINEAR = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")
# oneDNN has bf16 GEMMs only on CPUs with AVX-512 (it raises "could not create a primitive descriptor" on
# others, e.g. AVX2-only ones), so bf16 there keeps PyTorch's own kernels.
_ONEDNN_DTYPES = (
    (torch.float32, torch.bfloat16)
    if _ONEDNN_LINEAR and torch.ops.mkldnn._is_mkldnn_bf16_supported()
    else (torch.float32,)
)
# oneDNN's name of each activation it can fuse.
_ONEDNN_ACTIVATIONS = {nn.SiLU: "swish", nn.ReLU: "relu"}


def gemm_choice_applies(x: Tensor) -> bool:
    """Whether GEMMs on x may take either path (CPU inference in a precision oneDNN computes; torch.compile
    and exporters choose their own kernels)."""
    return (
        _ONEDNN_LINEAR
        and x.device.type == "cpu"
        and x.dtype in _ONEDNN_DTYPES
        and not torch.is_grad_enabled()
        and not torch.compiler.is_compiling()
    )


def _onednn(x: Tensor) -> bool:
    """Whether `linear` and its variants run x through oneDNN: where it may and was not measured slower."""
    return gemm_choice_applies(x) and kernels.active() != kernels.ATEN


def gemm_choice(key: str, work: Callable[[], object], x: Tensor) -> str | None:
    """The faster GEMM path for `work` on inputs like x (`key` says what else its speed depends on),
    measured once per process (and per file of `kernels.remember_in`); None where there is no choice."""
    if not gemm_choice_applies(x):
        return None
    key = f"{key} | {tuple(x.shape)} {str(x.dtype).removeprefix('torch.')}"
    return kernels.choose(key, {kernels.ATEN: work, kernels.ONEDNN: work})


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """F.linear, through oneDNN for CPU inference."""
    if _onednn(x):
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
    return F.linear(x, weight, bias)


def linear_act(x: Tensor, weight: Tensor, bias: Tensor | None, act: nn.Module) -> Tensor:
    """act(F.linear(x, weight, bias)), the activation fused into the GEMM where oneDNN has it."""
    name = _ONEDNN_ACTIVATIONS.get(type(act))
    if name is not None and _onednn(x):
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, name, [], "")
    return act(F.linear(x, weight, bias))


def linear_mul(x: Tensor, other: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """F.linear(x, weight, bias) * other, for `other` of the output's shape."""
    if _onednn(x) and other.dtype == x.dtype and other.is_contiguous():
        return torch.ops.mkldnn._linear_pointwise.binary(x, other, weight, bias, "mul")
    return scaled(F.linear(x, weight, bias), other)


def linear_add(x: Tensor, other: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """F.linear(x, weight, bias) + other, for `other` of the output's shape."""
    if _onednn(x) and other.dtype == x.dtype and other.is_contiguous():
        return torch.ops.mkldnn._linear_pointwise.binary(x, other, weight, bias, "add")
    return F.linear(x, weight, bias) + other


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
    norm = torch.linalg.vector_norm(x, dim=-1, keepdim=True, dtype=torch.float32)
    scale = torch.rsqrt(norm.square() / x.shape[-1] + eps)
    return _contiguous_product(x, scale)


def _contiguous_product(x: Tensor, y: Tensor) -> Tensor:
    """x * y in x's dtype and x's shape, contiguous, in one pass: the product is taken in the wider of
    their dtypes and rounded once."""
    if torch.is_grad_enabled() and (x.requires_grad or y.requires_grad):
        return (x * y).to(x.dtype).contiguous()
    return torch.mul(x, y, out=torch.empty_like(x, memory_format=torch.contiguous_format))


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


def rope_periods(head_dim: int, theta: float, device: torch.device | None = None) -> Tensor:
    """The 2D RoPE's periods (head_dim / 4,) in float32: theta ** (4 k / head_dim), k = 0, 1, ..."""
    # Computed on the CPU, then moved: arange on the meta device (models are built there before loading)
    # imports torch's compiler, a second or more of the first load.
    steps = torch.arange(head_dim // 4, dtype=torch.float32, device="cpu")
    return (theta ** (steps * 4 / head_dim)).to(device or torch.get_default_device())


class RopeEmbedding(nn.Module):
    """The periods of the 2D RoPE as a buffer, `rope_embed.periods` in the official checkpoints, which store
    the values the model was trained with (bf16, about 1e-3 from `rope_periods`); a checkpoint without them
    gets `rope_periods`."""

    def __init__(self, head_dim: int, theta: float) -> None:
        super().__init__()
        self.head_dim, self.theta = head_dim, theta
        self.register_buffer("periods", rope_periods(head_dim, theta))
        self._values: tuple[float, ...] | None = None
        self.register_load_state_dict_post_hook(lambda module, keys: module.forget_values())

    def forget_values(self) -> None:
        self._values = None

    def values(self) -> tuple[float, ...]:
        """The periods as numbers (a cache key), read from the buffer once after each load or move."""
        if self._values is None:
            self._values = tuple(self.periods.float().tolist())
        return self._values

    def _apply(self, fn, recurse=True):  # noqa: ANN001, ANN202 - nn.Module's signature
        super()._apply(fn, recurse)
        self.forget_values()
        return self

    def _load_from_state_dict(self, state_dict, prefix, *args):  # noqa: ANN001, ANN002 - nn.Module's
        # A state dict without the periods (transformers' files) keeps the computed ones, even when strict.
        if prefix + "periods" in state_dict:
            super()._load_from_state_dict(state_dict, prefix, *args)


def rope_tables_at(
    coords: Tensor, periods: tuple[float, ...], num_prefix: int, dtype: torch.dtype
) -> tuple[Tensor, Tensor]:
    """cos and signed-sin tables (tokens, head_dim) of the 2D RoPE of `periods` at patch coordinates (N, 2)
    (y, x), computed in float32; identity on the prefix tokens.

    Each quarter of the head channels rotates with one period of one axis, in the layout [y, x, y, x].
    """
    head_dim = 4 * len(periods)
    period = torch.tensor(periods, dtype=torch.float32, device=coords.device)
    angles = (2 * math.pi * coords[:, :, None] / period).flatten(1, 2).tile(2)
    cos, sin = angles.cos(), angles.sin()
    half = head_dim // 2
    # rotate_half(x) * sin == swap_halves(x) * [-sin, sin], so the sign lives in the table.
    sin = torch.cat((-sin[:, :half], sin[:, half:]), dim=-1)
    cos = torch.cat((cos.new_ones(num_prefix, head_dim), cos))
    sin = torch.cat((sin.new_zeros(num_prefix, head_dim), sin))
    return cos.to(dtype), sin.to(dtype)


@lru_cache(maxsize=16)
def rope_tables(
    grid: tuple[int, int],
    periods: tuple[float, ...],
    num_prefix: int,
    dtype: torch.dtype,
    device: torch.device,
) -> tuple[Tensor, Tensor]:
    """`rope_tables_at` the patch centres of `grid`, cached."""
    with torch.inference_mode(False):
        return rope_tables_at(patch_coordinates(grid, device), periods, num_prefix, dtype)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate (B, heads, tokens, head_dim) queries or keys by the tables of `rope_tables`; the result is
    contiguous, the layout attention reads fastest."""
    half = x.shape[-1] // 2
    if torch.onnx.is_in_onnx_export():  # the in-place halves below would be exported as scatters
        return x * cos + torch.cat((x[..., half:], x[..., :half]), dim=-1) * sin
    out = _contiguous_product(x, cos)
    # rotate_half(x) * sin, one half at a time, with no copy of the rotated x.
    out[..., :half].addcmul_(x[..., half:], sin[..., :half])
    out[..., half:].addcmul_(x[..., :half], sin[..., half:])
    return out


def scaled_rope(cos: Tensor, sin: Tensor, scale: Tensor) -> tuple[Tensor, Tensor]:
    """Tables that rotate x * scale (a per-channel scale) when applied to x: RoPE of the QK norm's output
    without a pass over the queries or keys for the scale."""
    half = scale.shape[-1] // 2
    return cos * scale, sin * torch.cat((scale[half:], scale[:half]))


def stacked_projection(*linears: nn.Linear) -> tuple[Tensor, Tensor | None]:
    """Weight and bias of the linear layers as one layer whose outputs are theirs, concatenated."""
    weight = _stacked([linear.weight for linear in linears])
    if all(linear.bias is None for linear in linears):
        return weight, None
    biases = [
        linear.weight.new_zeros(linear.out_features) if linear.bias is None else linear.bias
        for linear in linears
    ]
    return weight, _stacked(biases)


def _stacked(tensors: list[Tensor]) -> Tensor:
    """The tensors concatenated along their first dimension: a view when they already lie one after the
    other in one storage (as the weight loader reads the q, k and v projections), else a copy."""
    first, offset = tensors[0], tensors[0].storage_offset()
    shape = (sum(len(tensor) for tensor in tensors), *first.shape[1:])
    if first.is_meta:  # no values to copy; torch.cat on the meta device would import torch's compiler
        return first.new_empty(shape)
    for tensor in tensors:
        if (
            not tensor.is_contiguous()
            or tensor.dtype != first.dtype
            or tensor.shape[1:] != first.shape[1:]
            or tensor.untyped_storage().data_ptr() != first.untyped_storage().data_ptr()
            or tensor.storage_offset() != offset
        ):
            return torch.cat(tensors)
        offset += tensor.numel()
    return first.data.as_strided(shape, first.stride())  # of .data: no autograd link to a parameter


def _fuse_after_load(module: Attention, incompatible_keys: object) -> None:
    module.fuse_projections()  # loading with assign=True gives the projections new tensors


class Attention(nn.Module):
    """Multi-head self-attention with grouped key/value heads, QK RMSNorm and 2D RoPE on patch tokens.

    The q, k and v projections keep their own parameters (`wq`, `wk`, `wv`, the checkpoints' names), stored
    side by side in one tensor so that inference runs them as one GEMM without copying them (see
    `fuse_projections`); while gradients are recorded they run as three GEMMs, so that no stacked copy of the
    weights is kept for the backward pass. Without `layer_scale` the output is not scaled (no `gamma`); called
    without RoPE tables, no position is encoded (the 4K tokenizer's blocks).
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
        self.gamma = LayerScale(dim) if layer_scale else None
        self._fused: tuple[Tensor, Tensor | None] | None = None
        self._fused_pointers: tuple[int, ...] = ()
        self.register_load_state_dict_post_hook(_fuse_after_load)
        self.fuse_projections()

    def _projection_tensors(self) -> list[Tensor]:
        layers = (self.wq, self.wk, self.wv)
        return [t for layer in layers for t in (layer.weight, layer.bias) if t is not None]

    def fuse_projections(self) -> None:
        """Copy the q, k and v weights (and biases) into one tensor each and make the parameters views of
        it: the same parameters and names, updated in place by loading or by an optimizer, and one
        projection for inference. Runs on construction, after loading, after dtype/device moves and on
        copies."""
        # Views must be of the parameters' own kind: inference tensors when built in inference mode.
        with torch.inference_mode(self.wq.weight.is_inference()), torch.no_grad():
            weight, bias = stacked_projection(self.wq, self.wk, self.wv)
            start = 0
            for layer in (self.wq, self.wk, self.wv):
                rows = slice(start, start + layer.out_features)
                layer.weight.data = weight[rows]
                if layer.bias is not None:
                    layer.bias.data = bias[rows]
                start = rows.stop
        self._fused = (weight, bias)
        self._fused_pointers = tuple(t.data_ptr() for t in self._projection_tensors())

    def _apply(self, fn, recurse=True):  # noqa: ANN001, ANN202 - nn.Module's signature
        # Conversions such as .to(), .half() or .cuda() give each parameter a storage of its own again.
        super()._apply(fn, recurse)
        self.fuse_projections()
        return self

    def __setstate__(self, state: dict) -> None:
        # So do copy.deepcopy and unpickling.
        super().__setstate__(state)
        self.fuse_projections()

    def qkv_projection(self) -> tuple[Tensor, Tensor | None]:
        """Weight and bias of q, k and v as one projection: the fused tensors while the parameters are still
        views of them, else stacked now."""
        tensors = self._projection_tensors()
        if torch.compiler.is_compiling() or tuple(t.data_ptr() for t in tensors) == self._fused_pointers:
            return self._fused
        return stacked_projection(self.wq, self.wk, self.wv)  # a parameter was replaced since fusing

    def qkv(self, x: Tensor) -> Tensor:
        """q, k and v of x, concatenated on the last dimension."""
        layers = (self.wq, self.wk, self.wv)
        if torch.is_grad_enabled() and (
            x.requires_grad or any(t.requires_grad for t in self._projection_tensors())
        ):
            return torch.cat([F.linear(x, layer.weight, layer.bias) for layer in layers], dim=-1)
        return linear(x, *self.qkv_projection())

    def forward(
        self, x: Tensor, rope: tuple[Tensor, Tensor] | None, residual: Tensor | None = None
    ) -> Tensor:
        """The attention branch gamma * proj(attention), added to `residual` when given."""
        batch, tokens, dim = x.shape
        heads, kv_heads = self.num_heads, self.num_kv_heads
        qkv = self.qkv(x).view(batch, tokens, heads + 2 * kv_heads, self.head_dim)
        qk, v = qkv.transpose(1, 2).split((heads + kv_heads, kv_heads), dim=1)
        if self.q_norm is not None:
            qk = rms_normalize(qk, self.q_norm.eps)
        q, k = qk.split((heads, kv_heads), dim=1)
        if rope is not None:
            q_rope = k_rope = rope
            if self.q_norm is not None:
                # q and k are normalized together; each norm's scale rides in its own RoPE tables.
                q_rope, k_rope = (
                    scaled_rope(*rope, self.q_norm.weight),
                    scaled_rope(*rope, self.k_norm.weight),
                )
            q, k = apply_rope(q, *q_rope), apply_rope(k, *k_rope)
        elif self.q_norm is not None:
            q, k = q * self.q_norm.weight, k * self.k_norm.weight
        out = F.scaled_dot_product_attention(q, k, v, enable_gqa=kv_heads != heads)
        out = out.transpose(1, 2).reshape(batch, tokens, dim)
        if self.gamma is None:
            if residual is None:
                return self.proj(out)
            return linear_add(out, residual, self.proj.weight, self.proj.bias)
        projected = self.proj(out)
        if residual is None:
            return self.gamma(projected)
        return torch.addcmul(residual, projected, self.gamma.weight)


class SwiGLU(nn.Module):
    """Gated feed-forward: w3(act(x W1) * x W2) with W1 and W2 stored stacked as one `w12` projection."""

    def __init__(self, dim: int, hidden_dim: int, *, bias: bool = True, activation: str = "silu") -> None:
        super().__init__()
        self.w12 = Linear(dim, 2 * hidden_dim, bias=bias)
        self.w3 = Linear(hidden_dim, dim, bias=bias)
        self.act = ACTIVATIONS[activation]()

    def forward(self, x: Tensor, residual: Tensor | None = None) -> Tensor:
        """The feed-forward branch, added to `residual` when given."""
        hidden = self.w3.in_features
        w1, w2 = self.w12.weight.split(hidden)
        b1, b2 = (None, None) if self.w12.bias is None else self.w12.bias.split(hidden)
        # Two GEMMs, the activation fused into the first and the gating product into the second.
        gated = linear_mul(x, linear_act(x, w1, b1, self.act), w2, b2)
        if residual is None:
            return self.w3(gated)
        return linear_add(gated, residual, self.w3.weight, self.w3.bias)


class Block(nn.Module):
    """Pre-norm transformer block: x + gamma * attn(ln1(x)), then x + ffn(ln2(x))."""

    def __init__(self, attn: Attention, ffn: SwiGLU, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.ln1 = RMSNorm(dim, eps)
        self.attn = attn
        self.ln2 = RMSNorm(dim, eps)
        self.ffn = ffn

    def forward(self, x: Tensor, rope: tuple[Tensor, Tensor] | None) -> Tensor:
        x = self.attn(self.ln1(x), rope, residual=x)
        return self.ffn(self.ln2(x), residual=x)
