"""CUDA throughput of the 0.4b pose model, ours against transformers, from one random checkpoint, offline.

Writes random fp32 weights of the official 0.4b pose architecture once with transformers, loads them in
bfloat16 with both libraries, checks that our load never held an fp32 copy on the GPU and that both
models agree, then times 1024x768 inputs at batch 1 and 8: ms per image, images/s, achieved TFLOP/s and
the peak GPU memory of the forward for both, and the ratios. `--compile` also times our model under
torch.compile (what `--compile` / SAPIENS2_COMPILE=1 do in the app), with the warm-up (compile) time of
each batch size.

    python bench/bench_cuda.py [--compile]  # needs a CUDA GPU, a few minutes (compiling adds one or two)
    python bench/bench_cuda.py --cpu-smoke  # tiny model on the CPU: checks this script's logic only
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import sapiens2  # noqa: E402
from sapiens2 import presets, weights  # noqa: E402

MODEL_CARD_TFLOP = 1.26  # Sapiens2-0.4B at 1024x768, official model card
TINY = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 3, "num_attention_heads": 4,
        "num_key_value_attention_heads": 2, "num_first_full_attention_layers": 1,
        "num_last_full_attention_layers": 1,
        "head_config": {"upsample_out_channels": [16, 12], "upsample_kernel_sizes": [4, 4],
                        "conv_out_channels": [8, 8, 4], "conv_kernel_sizes": [1, 1, 1]}}  # fmt: skip


def write_checkpoint(directory: Path, device: torch.device, smoke: bool) -> None:
    """Random fp32 weights of the 0.4b pose model (tiny widths with `smoke`), saved by transformers."""
    import transformers

    config = {**presets.preset_config("0.4b", "pose"), **(TINY if smoke else {})}
    fields = {k: v for k, v in config.items() if k not in ("architectures", "model_type")}
    torch.manual_seed(0)
    with torch.device(device):  # random init is much faster on the GPU
        model = transformers.Sapiens2ForPoseEstimation(transformers.Sapiens2Config(**fields))
    model.save_pretrained(directory)


class PeakMemory:
    """Peak memory added since `start()`: CUDA allocations, or resident memory for the CPU smoke run."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def _proc(self, key: str) -> int:
        with open("/proc/self/status") as status:
            line = next(line for line in status if line.startswith(key + ":"))
        return int(line.split()[1]) * 1024

    def start(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            self.base = torch.cuda.memory_allocated()
        else:
            with open("/proc/self/clear_refs", "w") as refs:
                refs.write("5")  # peak resident size := current
            self.base = self._proc("VmRSS")

    def added(self) -> int:
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            return torch.cuda.max_memory_allocated() - self.base
        return self._proc("VmHWM") - self.base


def load_ours_checked(directory: Path, device: torch.device) -> nn.Module:
    """Load the fp32 file as bf16 and check the peak stayed near the bf16 size (no fp32 model copy)."""
    meter = PeakMemory(device)
    meter.start()
    model = sapiens2.from_pretrained(directory, device=device, dtype=torch.bfloat16)
    peak = meter.added()
    size = sum(p.numel() * p.element_size() for p in model.parameters())
    largest_fp32 = max(p.numel() for p in model.parameters()) * 4
    # One fp32 tensor in flight per loading thread at most; a full fp32 copy would add twice `size`. The
    # slack covers allocator rounding on the GPU, and interpreter and allocator noise in the CPU smoke run.
    slack = 8e6 if device.type == "cuda" else 64e6
    allowed = size + weights.LOAD_THREADS * largest_fp32 + slack
    print(f"load fp32 file -> bf16 on {device.type}: peak {peak / 1e6:.0f} MB for {size / 1e6:.0f} MB of "
          f"bf16 weights ({peak / size:.2f}x; allowed {allowed / 1e6:.0f} MB)")  # fmt: skip
    assert peak <= allowed, "loading held more than the bf16 model plus one tensor per thread"
    return model


def load_reference(directory: Path, device: torch.device) -> nn.Module:
    import transformers

    transformers.logging.set_verbosity_error()
    model = transformers.Sapiens2ForPoseEstimation.from_pretrained(directory, dtype=torch.bfloat16)
    return model.to(device).eval()


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def seconds_per_batch(forward: Callable[[], object], device: torch.device, iterations: int) -> float:
    for _ in range(3):
        forward()
    sync(device)
    start = time.perf_counter()
    for _ in range(iterations):
        forward()
    sync(device)
    return (time.perf_counter() - start) / iterations


def forward_peak(forward: Callable[[], object], device: torch.device) -> int:
    """Peak memory one forward adds to what is already held (CUDA allocations; resident memory on the CPU)."""
    meter = PeakMemory(device)
    meter.start()
    forward()
    return meter.added()


def warm_up_seconds(forward: Callable[[], object], device: torch.device) -> float:
    """Time of the first call: with torch.compile, compiling for this input shape."""
    sync(device)
    start = time.perf_counter()
    forward()
    sync(device)
    return time.perf_counter() - start


def counted_tflop(model: nn.Module, pixels: torch.Tensor) -> float:
    """TFLOP of one image counted by PyTorch (2 per multiply-add, attention included)."""
    with FlopCounterMode(display=False) as counter, torch.inference_mode():
        model(pixels[:1])
    return counter.get_total_flops() / 1e12


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu-smoke", action="store_true", help="tiny model on the CPU, to check the script")
    parser.add_argument("--compile", action="store_true", help="also time our model under torch.compile")
    parser.add_argument("--iterations", type=int, default=20)
    args = parser.parse_args()
    if not args.cpu_smoke and not torch.cuda.is_available():
        sys.exit("bench_cuda.py needs a CUDA GPU; PyTorch sees none (--cpu-smoke checks the script on CPU)")
    device = torch.device("cpu" if args.cpu_smoke else "cuda")
    height, width = (64, 48) if args.cpu_smoke else (1024, 768)
    batches = (1, 2) if args.cpu_smoke else (1, 8)
    iterations = 2 if args.cpu_smoke else args.iterations
    if device.type == "cuda":
        print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")

    with tempfile.TemporaryDirectory() as tmp:
        write_checkpoint(Path(tmp), device, args.cpu_smoke)
        ours = load_ours_checked(Path(tmp), device)
        reference = load_reference(Path(tmp), device)

    generator = torch.Generator(device).manual_seed(0)
    pixels = torch.randn(max(batches), 3, height, width, generator=generator, device=device)
    pixels = pixels.to(torch.bfloat16)
    with torch.inference_mode():
        ours_heatmaps = ours(pixels[:1]).heatmaps.float()
        expected = reference(pixels[:1]).heatmaps.float()
    error = float((ours_heatmaps - expected).norm() / expected.norm())
    print(f"bf16 heatmaps, ours vs transformers: relative error {error:.2e}")
    assert error < 5e-2, "the two models disagree"

    counted = counted_tflop(ours, pixels)
    print(f"TFLOP per image: {MODEL_CARD_TFLOP} (model card), {counted:.2f} counted by PyTorch"
          f"{'' if not args.cpu_smoke else ' (tiny model)'}")  # fmt: skip
    models = {"ours": ours, "transformers": reference}
    print(f"{'batch':>5} {'model':14} {'ms/image':>9} {'images/s':>9} {'TFLOP/s card':>13} "
          f"{'TFLOP/s counted':>16} {'peak MB':>8}")  # fmt: skip
    times: dict[tuple[str, int], tuple[float, int]] = {}

    def measure(name: str, model: nn.Module, batch: int) -> None:
        with torch.inference_mode():
            run = lambda: model(pixels[:batch])  # noqa: E731
            if name == "ours compiled":
                print(f"{batch:5d} {name:14} first call (compiling for this shape): "
                      f"{warm_up_seconds(run, device):.1f} s")  # fmt: skip
            seconds = seconds_per_batch(run, device, iterations) / batch
            peak = forward_peak(run, device)
        times[name, batch] = seconds, peak
        rates = f"{1 / seconds:9.1f} {MODEL_CARD_TFLOP / seconds:13.1f} {counted / seconds:16.1f}"
        print(f"{batch:5d} {name:14} {seconds * 1e3:9.2f} {rates} {peak / 1e6:8.0f}")

    for batch in batches:
        for name, model in models.items():
            measure(name, model, batch)
    if args.compile:
        ours.compile()  # in place, as the app's --compile does
        for batch in batches:
            measure("ours compiled", ours, batch)
        with torch.inference_mode():
            compiled_heatmaps = ours(pixels[:1]).heatmaps.float()
        error = float((compiled_heatmaps - ours_heatmaps).norm() / ours_heatmaps.norm())
        print(f"compiled vs eager heatmaps: relative difference {error:.2e}")
        assert error < 5e-2, "the compiled model disagrees with the eager one"
    for batch in batches:
        reference_time, reference_peak = times["transformers", batch]
        for name in ("ours", "ours compiled"):
            if (name, batch) in times:
                seconds, peak = times[name, batch]
                ratio = seconds / reference_time
                print(f"batch {batch}, {name} / transformers: time {ratio:.2f} (target <= 1), "
                      f"peak memory {peak / max(reference_peak, 1):.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
