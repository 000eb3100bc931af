"""The official optimizer and schedule: AdamW with layer-wise learning-rate decay, linear warmup, then
polynomial (linear) decay to zero.

Layer ids follow the official runner: the embeddings (patch embedding, CLS and register tokens) are layer 0,
block i is layer i + 1, everything else (final norm, decode head) is layer L + 1 of L blocks; a parameter of
layer l gets lr * decay ** (L + 1 - l). Biases and 1-D parameters have no weight decay.
"""

from __future__ import annotations

import torch
from torch import nn

BETAS = (0.9, 0.999)
WEIGHT_DECAY = 0.1
WARMUP_START = 1e-3  # the warmup's first learning rate, as a fraction of the peak
OFFICIAL_WARMUP = 500
MAX_GRAD_NORM = 2.0
OFFICIAL_LAYER_DECAY = 0.8
# sapiens/dense/configs/matting/gss_p3m_metasim/sapiens2_1b_matting_gss_p3m_metasim-1024x768.py
MATTING_LAYER_DECAY = 0.9
MATTING_MAX_GRAD_NORM = 4.0


def layer_id(name: str, num_layers: int) -> int:
    """The layer-decay id of a task model's parameter."""
    if name.startswith(("backbone.patch_embed", "backbone.cls_token", "backbone.storage_tokens")):
        return 0
    if name.startswith("backbone.blocks."):
        return int(name.split(".")[2]) + 1
    return num_layers + 1


def parameter_groups(
    model: nn.Module, lr: float, layer_decay: float, weight_decay: float = WEIGHT_DECAY
) -> list[dict]:
    """AdamW groups of the trainable parameters: one per (learning rate, weight decay)."""
    num_layers = len(model.backbone.blocks)
    groups: dict[tuple[float, float], list[nn.Parameter]] = {}
    for name, parameter in model.named_parameters():
        if not parameter.requires_grad:
            continue
        decay = 0.0 if parameter.ndim == 1 or name.endswith(".bias") else weight_decay
        scale = layer_decay ** (num_layers + 1 - layer_id(name, num_layers))
        groups.setdefault((lr * scale, decay), []).append(parameter)
    return [
        {"params": params, "lr": group_lr, "weight_decay": decay}
        for (group_lr, decay), params in groups.items()
    ]


def lr_factor(step: int, warmup: int, total: int) -> float:
    """The learning rate at `step` as a fraction of the peak: from WARMUP_START up to 1 over `warmup` steps,
    then down to 0 at `total`."""
    if step < warmup:
        return WARMUP_START + (1 - WARMUP_START) * step / warmup
    return max(0.0, 1 - (step - warmup) / max(1, total - warmup))


def default_warmup(total: int) -> int:
    """The official 500 warmup steps, or 5% of a shorter run."""
    return min(OFFICIAL_WARMUP, round(0.05 * total))


def build_optimizer(
    model: nn.Module, lr: float, layer_decay: float, warmup: int, total: int, fused: bool
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW over `parameter_groups` and its per-step schedule."""
    optimizer = torch.optim.AdamW(
        parameter_groups(model, lr, layer_decay), lr=lr, betas=BETAS, fused=fused or None
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(step, warmup, total))
    return optimizer, scheduler
