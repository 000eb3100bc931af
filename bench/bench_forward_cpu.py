"""CPU forward time of the bare Sapiens2 backbone: this package against transformers, same weights.

Random weights are saved with transformers' `save_pretrained` and loaded into both implementations.
Runs alternate between the two so that load from other processes hits both alike; the script prints the
median (and fastest run) of each, their ratio ours / reference, and the median of the ratios of
back-to-back runs.

    python -m bench.bench_forward_cpu [--runs 15] [--batch 4] [--height 256] [--width 192]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
import transformers
from safetensors.torch import load_file

from sapiens2.config import load_config
from sapiens2.models import build_model


def reference_config(hidden: int, layers: int) -> transformers.Sapiens2Config:
    """A backbone with GQA in the middle blocks, full attention at both ends, registers and QK norm."""
    heads = hidden // 64
    return transformers.Sapiens2Config(
        hidden_size=hidden,
        intermediate_size=4 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_attention_heads=heads // 2,
        num_first_full_attention_layers=layers // 4,
        num_last_full_attention_layers=layers // 4,
        num_register_tokens=8,
        image_size=[256, 192],
        architectures=["Sapiens2Model"],
    )


def timed(model: torch.nn.Module, pixel_values: torch.Tensor) -> float:
    start = time.perf_counter()
    model(pixel_values)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--height", type=int, default=256)
    parser.add_argument("--width", type=int, default=192)
    parser.add_argument("--hidden", type=int, default=384)
    parser.add_argument("--layers", type=int, default=8)
    args = parser.parse_args()

    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as directory:
        transformers.Sapiens2Model(reference_config(args.hidden, args.layers)).save_pretrained(directory)
        reference = transformers.Sapiens2Model.from_pretrained(directory).eval()
        ours = build_model(load_config(directory))
        ours.load_state_dict(load_file(Path(directory) / "model.safetensors"))

    pixel_values = torch.randn(args.batch, 3, args.height, args.width)
    times: dict[str, list[float]] = {"reference": [], "ours": []}
    with torch.inference_mode():
        error = (ours(pixel_values).last_hidden_state - reference(pixel_values).last_hidden_state).norm()
        error /= reference(pixel_values).last_hidden_state.norm()
        for _ in range(args.warmup):
            timed(reference, pixel_values)
            timed(ours, pixel_values)
        for _ in range(args.runs):
            times["reference"].append(timed(reference, pixel_values))
            times["ours"].append(timed(ours, pixel_values))

    reference_ms = 1e3 * statistics.median(times["reference"])
    ours_ms = 1e3 * statistics.median(times["ours"])
    fastest = {name: 1e3 * min(values) for name, values in times.items()}
    versions = f"torch {torch.__version__}, transformers {transformers.__version__}"
    print(
        f"hidden {args.hidden}, {args.layers} layers, batch {args.batch}, {args.height}x{args.width}, "
        f"{torch.get_num_threads()} threads, {versions}"
    )
    print(f"relative difference of last_hidden_state: {error:.2e}")
    print(f"reference (transformers): {reference_ms:.1f} ms (fastest run {fastest['reference']:.1f} ms)")
    print(f"ours:                     {ours_ms:.1f} ms (fastest run {fastest['ours']:.1f} ms)")
    fastest_ratio = fastest["ours"] / fastest["reference"]
    print(f"ratio ours / reference:   {ours_ms / reference_ms:.3f} (fastest runs {fastest_ratio:.3f})")
    paired = statistics.median(o / r for o, r in zip(times["ours"], times["reference"], strict=True))
    print(f"median of per-run ratios: {paired:.3f}")


if __name__ == "__main__":
    main()
