"""CPU forward time of the bare Sapiens2 backbone: this package against transformers, same weights.

Random weights are saved with transformers' `save_pretrained` and loaded into both implementations.
Runs alternate between the two so that load from other processes hits both alike; the script prints the
median (and fastest run) of each, their ratio ours / reference, and the median of the ratios of
back-to-back runs. `--profile` adds a torch.profiler table of one run of each.

    python -m bench.bench_forward_cpu [--config small|0.4b] [--dtype fp32|bf16] [--runs N] [--gemm PATH]

Configs: `small` is hidden 384, 8 blocks (GQA in the middle blocks, full attention at both ends), batch 4,
256x192; `0.4b` is the official 0.4b backbone (hidden 1024, 24 blocks, 16 heads, 8 key/value heads in the
middle 8 blocks), batch 1, 1024x768. `--hidden`, `--layers`, `--batch`, `--height`, `--width` override.
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

from sapiens2.models import kernels, presets
from sapiens2.models.config import load_config
from sapiens2.models.device import DTYPES, dtype_name
from sapiens2.models.modeling import build_model

CONFIGS = {
    "small": {"hidden": 384, "layers": 8, "batch": 4, "height": 256, "width": 192},
    "0.4b": {"hidden": 1024, "layers": 24, "batch": 1, "height": 1024, "width": 768},
}


def reference_config(hidden: int, layers: int, height: int, width: int) -> transformers.Sapiens2Config:
    """The official layout scaled to `hidden` and `layers`: 64-channel heads, half as many key/value heads
    in the middle blocks, full attention in the first and last third (a quarter below 24 blocks), 8
    registers, QK norm; at hidden 1024 and 24 blocks this is the 0.4b backbone."""
    heads = hidden // 64
    official = presets.preset_config("0.4b", "pretrain")
    full = official["num_first_full_attention_layers"] if layers >= 24 else layers // 4
    return transformers.Sapiens2Config(
        hidden_size=hidden,
        intermediate_size=4 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_attention_heads=heads // 2,
        num_first_full_attention_layers=full,
        num_last_full_attention_layers=full,
        num_register_tokens=official["num_register_tokens"],
        image_size=[height, width],
        architectures=["Sapiens2Model"],
    )


def cpu_flags() -> str:
    """The CPU's model and the vector and matrix extensions it reports (what decides the kernels)."""
    flags: list[str] = []
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for line in info:
                if line.startswith("flags"):
                    flags = line.split(":", 1)[1].split()
                    break
    except OSError:
        pass
    wanted = [flag for flag in flags if flag.startswith(("avx", "amx")) or flag in ("fma", "f16c")]
    capability = torch.backends.cpu.get_cpu_capability()
    return f"{kernels.cpu_name()} [{' '.join(wanted)}], torch capability {capability}"


def timed(model: torch.nn.Module, pixel_values: torch.Tensor, clock=time.perf_counter) -> float:
    start = clock()
    model(pixel_values)
    return clock() - start


def profile(name: str, model: torch.nn.Module, pixel_values: torch.Tensor, rows: int = 18) -> None:
    """One run under torch.profiler: the operators by their own CPU time."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profiler:
        model(pixel_values)
    events = profiler.key_averages()
    total = sum(event.self_cpu_time_total for event in events)
    print(f"\n{name}: {total / 1e6:.2f} s of operator time, by operator (self CPU time)")
    for event in sorted(events, key=lambda e: -e.self_cpu_time_total)[:rows]:
        own = event.self_cpu_time_total
        print(f"  {event.key:<52} {own / 1e3:10.1f} ms {100 * own / total:5.1f} % {event.count:5d}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", choices=list(CONFIGS), default="small")
    parser.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--profile", action="store_true", help="also print an operator profile of each")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's choice)")
    parser.add_argument(
        "--gemm",
        choices=["measured", kernels.ATEN, kernels.ONEDNN],
        default="measured",
        help="ours: the GEMM path chosen by measurement (default), or one path forced",
    )
    parser.add_argument(
        "--clock",
        choices=["wall", "cpu"],
        default="wall",
        help="cpu: the process's CPU time, which other processes disturb less (use with --threads 1, as "
        "waiting threads spin)",
    )
    for name in ("batch", "height", "width", "hidden", "layers"):
        parser.add_argument(f"--{name}", type=int, help=f"overrides the config's {name}")
    args = parser.parse_args()
    shape = {key: getattr(args, key) or value for key, value in CONFIGS[args.config].items()}
    dtype = DTYPES[args.dtype]
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.gemm != "measured":
        kernels.choose = lambda key, candidates, **kwargs: args.gemm

    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as directory:
        config = reference_config(shape["hidden"], shape["layers"], shape["height"], shape["width"])
        transformers.Sapiens2Model(config).save_pretrained(directory)
        transformers.logging.set_verbosity_error()
        reference = transformers.Sapiens2Model.from_pretrained(directory, dtype=dtype).eval()
        ours = build_model(load_config(directory)).to(dtype)
        ours.load_state_dict(load_file(Path(directory) / "model.safetensors"))

    pixel_values = torch.randn(shape["batch"], 3, shape["height"], shape["width"]).to(dtype)
    times: dict[str, list[float]] = {"reference": [], "ours": []}
    with torch.inference_mode():
        expected = reference(pixel_values).last_hidden_state.float()
        actual = ours(pixel_values).last_hidden_state.float()
        error = float((actual - expected).norm() / expected.norm())
        for _ in range(args.warmup):
            timed(reference, pixel_values)
            timed(ours, pixel_values)
        clock = time.process_time if args.clock == "cpu" else time.perf_counter
        for _ in range(args.runs):
            times["reference"].append(timed(reference, pixel_values, clock))
            times["ours"].append(timed(ours, pixel_values, clock))
        if args.profile:
            profile("transformers", reference, pixel_values)
            profile("ours", ours, pixel_values)

    reference_ms = 1e3 * statistics.median(times["reference"])
    ours_ms = 1e3 * statistics.median(times["ours"])
    fastest = {name: 1e3 * min(values) for name, values in times.items()}
    versions = f"torch {torch.__version__}, transformers {transformers.__version__}"
    print(
        f"\nhidden {shape['hidden']}, {shape['layers']} layers, batch {shape['batch']}, "
        f"{shape['height']}x{shape['width']}, {dtype_name(dtype)}, {torch.get_num_threads()} threads, "
        f"{args.runs} runs, {args.clock} clock, {versions}\n{cpu_flags()}"
    )
    chosen = ", ".join(sorted(set(kernels.choices().values()))) or "none (no choice applies)"
    print(f"our GEMM path: {chosen if args.gemm == 'measured' else args.gemm + ' (forced)'}")
    print(f"relative difference of last_hidden_state: {error:.2e}")
    print(f"reference (transformers): {reference_ms:.1f} ms (fastest run {fastest['reference']:.1f} ms)")
    print(f"ours:                     {ours_ms:.1f} ms (fastest run {fastest['ours']:.1f} ms)")
    fastest_ratio = fastest["ours"] / fastest["reference"]
    print(f"ratio ours / reference:   {ours_ms / reference_ms:.3f} (fastest runs {fastest_ratio:.3f})")
    paired = statistics.median(o / r for o, r in zip(times["ours"], times["reference"], strict=True))
    print(f"median of per-run ratios: {paired:.3f}")


if __name__ == "__main__":
    main()
