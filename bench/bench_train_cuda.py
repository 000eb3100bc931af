"""GPU training throughput and memory: the official pose model (random weights) at 1024x768 in bf16, with
and without gradient checkpointing, as `sapiens2 train` runs it (autocast, the recipe loss, AdamW with
layer decay, gradient clipping).

    python -m bench.bench_train_cuda [--size 0.4b] [--batch 4] [--steps 10] [--task pose]

Prints images/s over the timed steps and the peak GPU memory allocated, for each setting.
"""

from __future__ import annotations

import argparse
import time

import torch

from sapiens2.models import presets
from sapiens2.models.config import Sapiens2Config
from sapiens2.models.modeling import build_model
from sapiens2.training import optim
from sapiens2.training.tasks import get_training_task


def batch(task: str, size: int, height: int, width: int, labels: int, device: torch.device) -> dict:
    """Random inputs and targets of a batch, as the task's samples give them."""
    inputs = {"pixel_values": torch.randn(size, 3, height, width, device=device)}
    if task == "pose":
        inputs |= {
            "heatmaps": torch.rand(size, labels, height // 4, width // 4, device=device),
            "weights": torch.ones(size, labels, device=device),
        }
    else:
        inputs["labels"] = torch.randint(0, labels, (size, height, width), device=device)
    return inputs


def run(args: argparse.Namespace, checkpointing: bool) -> tuple[float, float]:
    """Images per second and peak memory (GiB) of `args.steps` training steps."""
    task = get_training_task(args.task)
    config = Sapiens2Config.from_dict(presets.preset_config(args.size, task.kind.name))
    device = torch.device(args.device)
    model = build_model(config).to(device).train()
    model.backbone.augment_positions = False
    model.backbone.gradient_checkpointing = checkpointing
    optimizer, scheduler = optim.build_optimizer(model, 5e-4, 0.8, 0, 10**6, fused=device.type == "cuda")
    inputs = batch(args.task, args.batch, args.height, args.width, config.num_labels, device)
    labels = task.recipe.default_labels(task.channels)  # the official classes' weights for segment

    def step() -> None:
        with torch.autocast(device.type, dtype=torch.bfloat16):
            outputs = model(inputs["pixel_values"])
            loss = torch.stack(list(task.loss_terms(outputs, inputs, labels).values())).sum()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), optim.MAX_GRAD_NORM)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(args.warmup):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    start = time.perf_counter()
    for _ in range(args.steps):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - start
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else float("nan")
    return args.steps * args.batch / seconds, peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", choices=["pose", "segment"], default="pose")
    parser.add_argument("--size", default="0.4b")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--height", type=int, default=1024)
    parser.add_argument("--width", type=int, default=768)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    name = torch.cuda.get_device_name(args.device) if args.device.startswith("cuda") else args.device
    print(f"{args.task} {args.size}, batch {args.batch}, {args.height}x{args.width}, bf16 autocast, {name}")
    for checkpointing in (False, True):
        setting = f"  gradient checkpointing {'on ' if checkpointing else 'off'}"
        try:
            images_per_second, peak = run(args, checkpointing)
            print(f"{setting}: {images_per_second:.2f} images/s, peak {peak:.1f} GiB")
        except torch.OutOfMemoryError:
            print(f"{setting}: out of memory at batch {args.batch}")
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
