"""The Sapiens2 vision transformer: patch tokens (grouped by the 4K tokenizer), CLS and register tokens,
blocks, final norm."""

from __future__ import annotations

import contextlib

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from sapiens2.models import kernels
from sapiens2.models.config import Sapiens2Config
from sapiens2.models.layers import (
    Attention,
    Block,
    PatchEmbed,
    RMSNorm,
    RopeEmbedding,
    SwiGLU,
    augment_coordinates,
    gemm_choice,
    gemm_choice_applies,
    patch_coordinates,
    rope_tables,
    rope_tables_at,
)

# Windows the tokenizer summarizes at once, as upstream does: its activations stay bounded whatever the photo
# size (the whole 1b-4k forward at 4096x3072 peaks at 1.2 GiB of activations in bf16). Results do not
# depend on it.
WINDOWS_PER_CHUNK = 1024


class WindowTokenizer(nn.Module):
    """The 4K backbone's hierarchical tokenizer: each window x window block of patch tokens becomes one token,
    read at a learned summary token (`w_cls`) after transformer blocks that see that block alone.

    Its blocks have full attention, biases everywhere, no QK norm, no layer scale, no RoPE (positions come
    from `local_pos_embed`) and a SwiGLU of 4x the width, as in the official checkpoint.
    """

    def __init__(self, config: Sapiens2Config) -> None:
        super().__init__()
        dim, heads = config.hidden_size, config.num_attention_heads
        self.window = config.window_size
        self.local_pos_embed = nn.Parameter(torch.zeros(1, 1 + self.window**2, dim))
        self.w_cls = nn.Parameter(torch.zeros(1, 1, dim))
        self.blocks = nn.ModuleList(
            Block(
                Attention(dim, heads, heads, qk_norm=False, eps=config.rms_norm_eps, layer_scale=False),
                SwiGLU(dim, 4 * dim, activation=config.hidden_act),
                dim,
                config.rms_norm_eps,
            )
            for _ in range(config.num_tokenizer_layers)
        )

    def forward(self, patches: Tensor, grid: tuple[int, int]) -> tuple[Tensor, tuple[int, int]]:
        """Patch tokens (B, h * w, C) on `grid` (h, w) -> one token per window (B, h/n * w/n, C), its grid."""
        batch, _, dim = patches.shape
        (height, width), n = grid, self.window
        if height % n or width % n:
            raise ValueError(
                f"the 4K tokenizer groups {n}x{n} patches: a {height}x{width} patch grid does not divide; "
                f"use an input whose sides are multiples of {n} patches"
            )
        rows, columns = height // n, width // n
        windows = patches.view(batch, rows, n, columns, n, dim).transpose(2, 3).reshape(-1, n * n, dim)
        summaries = torch.cat([self.summarize(chunk) for chunk in windows.split(WINDOWS_PER_CHUNK)])
        return summaries.view(batch, rows * columns, dim), (rows, columns)

    def summarize(self, windows: Tensor) -> Tensor:
        """The summary token (N, C) of each window of tokens (N, n * n, C)."""
        x = torch.cat((self.w_cls.expand(len(windows), -1, -1), windows), dim=1) + self.local_pos_embed
        for block in self.blocks:
            x = block(x, None)
        return x[:, 0]


class VisionTransformer(nn.Module):
    """ViT whose parameter names are the original checkpoints' (blocks.N.attn.wq, ffn.w12, ln1, ...)."""

    def __init__(self, config: Sapiens2Config) -> None:
        super().__init__()
        dim, eps = config.hidden_size, config.rms_norm_eps
        self.num_prefix_tokens = 1 + config.num_register_tokens
        self.rope_embed = RopeEmbedding(config.head_dim, config.rope_theta)
        # Random RoPE coordinate shift / jitter / rescale in training mode, as transformers does; the official
        # fine-tuning recipes train without it (see `augment_positions`).
        self.position_augmentation = (
            config.pos_embed_shift,
            config.pos_embed_jitter,
            config.pos_embed_rescale,
        )
        self.augment_positions = any(value is not None for value in self.position_augmentation)
        self.gradient_checkpointing = False
        self.patch_embed = PatchEmbed(config.num_channels, dim, config.patch_size)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.storage_tokens = nn.Parameter(torch.zeros(1, config.num_register_tokens, dim))
        self.tokenizer = WindowTokenizer(config) if config.use_tokenizer else None
        self.blocks = nn.ModuleList(
            Block(
                Attention(
                    dim,
                    config.num_attention_heads,
                    kv_heads,
                    qk_norm=config.use_qk_norm,
                    eps=eps,
                    query_bias=config.query_bias,
                    key_bias=config.key_bias,
                    value_bias=config.value_bias,
                    proj_bias=config.proj_bias,
                ),
                SwiGLU(dim, config.intermediate_size, bias=config.mlp_bias, activation=config.hidden_act),
                dim,
                eps,
            )
            for kv_heads in config.num_key_value_heads_per_layer
        )
        self.ln1 = RMSNorm(dim, eps)

    def embed(self, pixel_values: Tensor) -> tuple[Tensor, tuple[Tensor, Tensor], tuple[int, int]]:
        """Tokens [CLS, registers, patches] (B, N, C), their RoPE tables and the patch grid (h, w)."""
        dtype = self.patch_embed.projection.weight.dtype
        patches, grid = self.patch_embed(pixel_values.to(dtype))
        if self.tokenizer is not None:
            patches, grid = self.tokenizer(patches, grid)
        batch = patches.shape[0]
        prefix = (self.cls_token.expand(batch, -1, -1), self.storage_tokens.expand(batch, -1, -1))
        tokens = torch.cat((*prefix, patches), dim=1)
        if self.training and self.augment_positions:
            coords = augment_coordinates(patch_coordinates(grid, tokens.device), *self.position_augmentation)
            rope = rope_tables_at(coords, self.rope_embed.values(), self.num_prefix_tokens, dtype)
        else:
            # torch.compile traces the tables into its graph; eager runs reuse them per input size, and so
            # do ONNX exports, which store them as constants (`onnx_export` fills the cache first).
            tracing = torch.compiler.is_compiling() and not torch.onnx.is_in_onnx_export()
            tables = rope_tables.__wrapped__ if tracing else rope_tables
            periods = self.rope_embed.values()
            rope = tables(grid, periods, self.num_prefix_tokens, dtype, tokens.device)
        return tokens, rope, grid

    def run_block(self, index: int, x: Tensor, rope: tuple[Tensor, Tensor]) -> Tensor:
        """Block `index` on tokens x; with `gradient_checkpointing` in training, its activations are
        recomputed in the backward pass instead of kept."""
        block = self.blocks[index]
        if self.gradient_checkpointing and self.training and torch.is_grad_enabled():
            return checkpoint(block, x, rope, use_reentrant=False)
        return block(x, rope)

    def fastest_kernels(self, x: Tensor, rope: tuple[Tensor, Tensor]) -> contextlib.AbstractContextManager:
        """Where the blocks' GEMMs run faster on this CPU for tokens like x: measured on the first and the
        middle block (full and grouped attention) at the first forward of each shape and precision."""
        if not gemm_choice_applies(x):  # training, other devices, torch.compile: nothing to choose
            return contextlib.nullcontext()
        blocks = [self.blocks[index] for index in sorted({0, len(self.blocks) // 2})]
        shapes = ", ".join(
            f"{block.attn.num_heads}/{block.attn.num_kv_heads} heads, ffn {block.ffn.w3.in_features}"
            for block in blocks
        )
        return kernels.using(gemm_choice(shapes, lambda: [block(x, rope) for block in blocks], x))

    def forward(self, pixel_values: Tensor) -> tuple[Tensor, tuple[int, int]]:
        """Final-normalized tokens (B, N, C) and the patch grid (h, w)."""
        x, rope, grid = self.embed(pixel_values)
        with self.fastest_kernels(x, rope):
            for index in range(len(self.blocks)):
                x = self.run_block(index, x, rope)
        return self.ln1(x), grid

    def patch_features(self, tokens: Tensor, grid: tuple[int, int]) -> Tensor:
        """Patch tokens (B, N, C) of a token sequence as a feature map (B, C, h, w)."""
        patches = tokens[:, self.num_prefix_tokens :]
        return patches.transpose(1, 2).reshape(patches.shape[0], -1, *grid)
