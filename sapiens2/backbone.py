"""The Sapiens2 vision transformer: patch tokens, CLS and register tokens, blocks, final norm."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from sapiens2.config import Sapiens2Config
from sapiens2.layers import Attention, Block, PatchEmbed, RMSNorm, SwiGLU, rope_tables


class VisionTransformer(nn.Module):
    """ViT whose parameter names are the original checkpoints' (blocks.N.attn.wq, ffn.w12, ln1, ...)."""

    def __init__(self, config: Sapiens2Config) -> None:
        super().__init__()
        dim, eps = config.hidden_size, config.rms_norm_eps
        self.num_prefix_tokens = 1 + config.num_register_tokens
        self.head_dim = config.head_dim
        self.rope_theta = config.rope_theta
        self.patch_embed = PatchEmbed(config.num_channels, dim, config.patch_size)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.storage_tokens = nn.Parameter(torch.zeros(1, config.num_register_tokens, dim))
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
        batch = patches.shape[0]
        prefix = (self.cls_token.expand(batch, -1, -1), self.storage_tokens.expand(batch, -1, -1))
        tokens = torch.cat((*prefix, patches), dim=1)
        # torch.compile traces the tables into its graph; eager runs reuse them per input size.
        tables = rope_tables.__wrapped__ if torch.compiler.is_compiling() else rope_tables
        rope = tables(grid, self.head_dim, self.rope_theta, self.num_prefix_tokens, dtype, tokens.device)
        return tokens, rope, grid

    def forward(self, pixel_values: Tensor) -> tuple[Tensor, tuple[int, int]]:
        """Final-normalized tokens (B, N, C) and the patch grid (h, w)."""
        x, rope, grid = self.embed(pixel_values)
        for block in self.blocks:
            x = block(x, rope)
        return self.ln1(x), grid

    def patch_features(self, tokens: Tensor, grid: tuple[int, int]) -> Tensor:
        """Patch tokens (B, N, C) of a token sequence as a feature map (B, C, h, w)."""
        patches = tokens[:, self.num_prefix_tokens :]
        return patches.transpose(1, 2).reshape(patches.shape[0], -1, *grid)
