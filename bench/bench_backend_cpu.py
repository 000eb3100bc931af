"""CPU forward time of the two backends: PyTorch (this package's model, kernels chosen by measurement) against
ONNX Runtime running the same model's ONNX export (`--backend onnxruntime`), same random weights, fp32.

Runs alternate between the two so that load from other processes hits both alike; the script prints the
export time, the agreement, the median (and fastest run) of each, their ratio onnxruntime / torch and the
median of the ratios of back-to-back runs.

    python -m bench.bench_backend_cpu [--config small|0.4b] [--runs N] [--threads N] [--clock wall|cpu]

Configs as in bench_forward_cpu: `small` is hidden 384, 8 blocks, batch 4, 256x192; `0.4b` the official
0.4b backbone at batch 1, 1024x768; `--hidden`, `--layers`, `--batch`, `--height`, `--width` override.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from bench.bench_forward_cpu import CONFIGS, cpu_flags, reference_config, timed
from sapiens2.models import kernels
from sapiens2.models.config import load_config
from sapiens2.models.modeling import build_model
from sapiens2.runtime.onnx_backend import OnnxRuntimeModel


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", choices=list(CONFIGS), default="small")
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--threads", type=int, default=0, help="threads of both (default: torch's choice)")
    parser.add_argument("--clock", choices=["wall", "cpu"], default="wall")
    for name in ("batch", "height", "width", "hidden", "layers"):
        parser.add_argument(f"--{name}", type=int, help=f"overrides the config's {name}")
    args = parser.parse_args()
    shape = {key: getattr(args, key) or value for key, value in CONFIGS[args.config].items()}
    if args.threads:
        torch.set_num_threads(args.threads)
    import transformers
    from safetensors.torch import load_file

    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as directory:
        config = reference_config(shape["hidden"], shape["layers"], shape["height"], shape["width"])
        transformers.Sapiens2Model(config).save_pretrained(directory)
        ours = build_model(load_config(directory))
        ours.load_state_dict(load_file(Path(directory) / "model.safetensors"))
    ours.eval()
    onnx_model = OnnxRuntimeModel(ours)
    pixel_values = torch.randn(shape["batch"], 3, shape["height"], shape["width"])
    start = time.perf_counter()
    onnx_model.session((shape["height"], shape["width"]))
    export_s = time.perf_counter() - start

    times: dict[str, list[float]] = {"torch": [], "onnxruntime": []}
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    with torch.inference_mode():
        expected = ours(pixel_values).last_hidden_state
        actual = onnx_model(pixel_values).last_hidden_state
        error = float((actual - expected).abs().max() / expected.abs().max())
        for _ in range(args.warmup):
            timed(ours, pixel_values)
            timed(onnx_model, pixel_values)
        for _ in range(args.runs):
            times["torch"].append(timed(ours, pixel_values, clock))
            times["onnxruntime"].append(timed(onnx_model, pixel_values, clock))

    medians = {name: 1e3 * statistics.median(values) for name, values in times.items()}
    fastest = {name: 1e3 * min(values) for name, values in times.items()}
    print(
        f"\nhidden {shape['hidden']}, {shape['layers']} layers, batch {shape['batch']}, "
        f"{shape['height']}x{shape['width']}, fp32, {torch.get_num_threads()} threads, {args.runs} runs, "
        f"{args.clock} clock · {cpu_flags()}"
    )
    chosen = ", ".join(sorted(set(kernels.choices().values()))) or "none (no choice applies)"
    print(f"torch GEMM path chosen: {chosen}; export + session: {export_s:.1f} s")
    print(f"max difference / max value of last_hidden_state: {error:.2e}")
    for name in times:
        print(f"{name:<12} {medians[name]:9.1f} ms (fastest run {fastest[name]:.1f} ms)")
    ratio = medians["onnxruntime"] / medians["torch"]
    paired = statistics.median(o / t for o, t in zip(times["onnxruntime"], times["torch"], strict=True))
    fastest_ratio = fastest["onnxruntime"] / fastest["torch"]
    print(f"ratio onnxruntime / torch: {ratio:.3f} (fastest runs {fastest_ratio:.3f})")
    print(f"median of per-run ratios: {paired:.3f}")


if __name__ == "__main__":
    main()
