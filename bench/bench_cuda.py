"""CUDA throughput of every task's model, ours against transformers, and of the live webcam path, offline.

For each model kind (pose, seg, normal and pointmap at 0.4b, matting at 1b, the official architectures)
it writes random fp32 weights once with transformers, loads them in bfloat16 with both libraries, checks
that our load never held an fp32 copy on the GPU and that both models agree, then times 1024x768 inputs
at batch 1 and 8: ms per image, images/s, achieved TFLOP/s and the peak GPU memory of the forward for
both, and the ratios. `--compile` also times our pose model (`--compile-kinds`) under torch.compile (what
`--compile` / SAPIENS2_COMPILE=1 do in the app), with the warm-up (compile) time of each batch size.

`--live` then times the live webcam path end to end in this process: `Runtime.run("pose", frame)` on
640x480 frames with one person (the app's handler for each webcam frame: crop, one forward, keypoint
decoding, drawing), with a detector that returns one fixed box (ultralytics is not needed; its yolo11n
costs a few ms per frame on a GPU, measured apart when ultralytics is importable). The target of the
live webcam on a GPU is 20 frames/s or more for pose 0.4b with one person.

    python bench/bench_cuda.py [--compile] [--live] [--kinds pose,seg] [--json results.json]
    python bench/bench_cuda.py --cpu-smoke --live  # tiny models on the CPU: checks this script's logic only
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import sapiens2  # noqa: E402
from sapiens2.models import presets, weights  # noqa: E402
from sapiens2.models.kinds import get_kind  # noqa: E402

# The official size of each kind measured (matting exists at 1b only).
SIZES = {"pose": "0.4b", "seg": "0.4b", "normal": "0.4b", "pointmap": "0.4b", "matting": "1b"}
MODEL_CARD_TFLOP = {"0.4b": 1.26}  # per 1024x768 image, the official model card's figure for the 0.4b
SMOKE_INPUT = {"pointmap": (160, 96)}  # the tiny pointmap checkpoint's scale branch wants 10x6 patches
LIVE_FRAME = (480, 640)


def write_checkpoint(directory: Path, kind: str, device: torch.device, smoke: bool) -> None:
    """Random fp32 weights of the official `kind` model (tiny widths with `smoke`), saved by transformers."""
    import transformers

    if smoke:
        from tiny_models import tiny_config

        extra = {"image_size": SMOKE_INPUT[kind]} if kind in SMOKE_INPUT else {}
        config = tiny_config(kind, SIZES[kind], **extra)
    else:
        config = presets.preset_config(SIZES[kind], kind)
    fields = {k: v for k, v in config.items() if k not in ("architectures", "model_type")}
    torch.manual_seed(0)
    with torch.device(device):  # random init is much faster on the GPU
        model = getattr(transformers, get_kind(kind).architecture)(transformers.Sapiens2Config(**fields))
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


def load_ours_checked(directory: Path, device: torch.device) -> tuple[nn.Module, float]:
    """Load the fp32 file as bf16 and check the peak stayed near the bf16 size (no fp32 model copy); the
    model and the seconds the load took."""
    meter = PeakMemory(device)
    meter.start()
    start = time.perf_counter()
    model = sapiens2.from_pretrained(directory, device=device, dtype=torch.bfloat16)
    sync(device)
    seconds = time.perf_counter() - start
    peak = meter.added()
    size = sum(p.numel() * p.element_size() for p in model.parameters())
    largest_fp32 = max(p.numel() for p in model.parameters()) * 4
    # One fp32 tensor in flight per loading thread at most; a full fp32 copy would add twice `size`. The
    # slack covers allocator rounding on the GPU, and interpreter and allocator noise in the CPU smoke run.
    slack = 8e6 if device.type == "cuda" else 64e6
    allowed = size + weights.LOAD_THREADS * largest_fp32 + slack
    print(f"  load fp32 file -> bf16 on {device.type}: {seconds:.1f} s, peak {peak / 1e6:.0f} MB for "
          f"{size / 1e6:.0f} MB of bf16 weights ({peak / size:.2f}x; "
          f"allowed {allowed / 1e6:.0f} MB)")  # fmt: skip
    assert peak <= allowed, "loading held more than the bf16 model plus one tensor per thread"
    return model, seconds


def load_reference(directory: Path, kind: str, device: torch.device) -> nn.Module:
    import transformers

    transformers.logging.set_verbosity_error()
    architecture = getattr(transformers, get_kind(kind).architecture)
    return architecture.from_pretrained(directory, dtype=torch.bfloat16).to(device).eval()


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
    """TFLOP of one image counted by PyTorch (2 per multiply-add, attention included). Attention runs as its
    plain matrix products here: the counter's formulas for the fused CUDA kernels reject their own layouts
    (torch 2.11 on an H200)."""
    math_only = torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH)
    with FlopCounterMode(display=False) as counter, math_only, torch.inference_mode():
        model(pixels[:1])
    return counter.get_total_flops() / 1e12


def main_output(output: Any, name: str) -> torch.Tensor:
    return getattr(output, name).float()


def bench_kind(kind: str, args: argparse.Namespace, device: torch.device, results: dict) -> None:
    """Load, agreement, and times of one kind's model: ours, transformers' and (with --compile) ours
    compiled, at each batch size."""
    size = SIZES[kind]
    print(f"\n{kind} {size}")
    height, width = SMOKE_INPUT.get(kind, (64, 48)) if args.cpu_smoke else (1024, 768)
    batches = (1, 2) if args.cpu_smoke else (1, 8)
    iterations = 2 if args.cpu_smoke else args.iterations
    with tempfile.TemporaryDirectory() as tmp:
        write_checkpoint(Path(tmp), kind, device, args.cpu_smoke)
        ours, load_seconds = load_ours_checked(Path(tmp), device)
        reference = load_reference(Path(tmp), kind, device)

    generator = torch.Generator(device).manual_seed(0)
    pixels = torch.randn(max(batches), 3, height, width, generator=generator, device=device)
    pixels = pixels.to(torch.bfloat16)
    with torch.inference_mode():
        first = ours(pixels[:1])
        name = next(iter(vars(first)))  # heatmaps, logits, normals, pointmaps or alphas
        eager = main_output(first, name)
        expected = main_output(reference(pixels[:1]), name)
    error = float((eager - expected).norm() / expected.norm())
    print(f"  bf16 {name}, ours vs transformers: relative error {error:.2e}")
    assert error < 5e-2, "the two models disagree"

    counted = counted_tflop(ours, pixels)
    card = MODEL_CARD_TFLOP.get(size)
    print(f"  TFLOP per image: {card or '-'} (model card), {counted:.2f} counted by PyTorch"
          f"{'' if not args.cpu_smoke else ' (tiny model)'}")  # fmt: skip
    print(f"  {'batch':>5} {'model':14} {'ms/image':>9} {'images/s':>9} {'TFLOP/s card':>13} "
          f"{'TFLOP/s counted':>16} {'peak MB':>8}")  # fmt: skip
    rows: dict[str, dict[str, float]] = {}

    def measure(label: str, model: nn.Module, batch: int) -> None:
        row: dict[str, float] = {}
        with torch.inference_mode():
            run = lambda: model(pixels[:batch])  # noqa: E731
            if label == "ours compiled":
                row["compile_s"] = warm_up_seconds(run, device)
                print(
                    f"  {batch:5d} {label:14} first call (compiling for this shape): {row['compile_s']:.1f} s"
                )
            seconds = seconds_per_batch(run, device, iterations) / batch
            peak = forward_peak(run, device)
        row |= {"ms_per_image": seconds * 1e3, "images_per_s": 1 / seconds, "peak_mb": peak / 1e6}
        rows[f"{label} batch {batch}"] = row
        card_rate = f"{card / seconds:13.1f}" if card else f"{'-':>13}"
        rates = f"{1 / seconds:9.1f} {card_rate} {counted / seconds:16.1f}"
        print(f"  {batch:5d} {label:14} {seconds * 1e3:9.2f} {rates} {peak / 1e6:8.0f}")

    for batch in batches:
        for label, model in (("ours", ours), ("transformers", reference)):
            measure(label, model, batch)
    if args.compile and kind in args.compile_kinds.split(","):
        ours.compile()  # in place, as the app's --compile does
        for batch in batches:
            measure("ours compiled", ours, batch)
        with torch.inference_mode():
            compiled = main_output(ours(pixels[:1]), name)
        difference = float((compiled - eager).norm() / eager.norm())
        print(f"  compiled vs eager {name}: relative difference {difference:.2e}")
        assert difference < 5e-2, "the compiled model disagrees with the eager one"
    for batch in batches:
        reference_row = rows[f"transformers batch {batch}"]
        for label in ("ours", "ours compiled"):
            row = rows.get(f"{label} batch {batch}")
            if row is not None:
                row["time_ratio"] = row["ms_per_image"] / reference_row["ms_per_image"]
                row["memory_ratio"] = row["peak_mb"] / max(reference_row["peak_mb"], 1e-6)
                print(f"  batch {batch}, {label} / transformers: time {row['time_ratio']:.2f} "
                      f"(target <= 1), peak memory {row['memory_ratio']:.2f}")  # fmt: skip
    results[kind] = {"size": size, "load_s": load_seconds, "relative_error": error, "rows": rows}
    del ours, reference
    if device.type == "cuda":
        torch.cuda.empty_cache()


def live_frames(seconds: float) -> list[np.ndarray]:
    """Frames of the example photos at 640x480, shifted a little each time (no two frames alike)."""
    import cv2

    photos = [
        cv2.imread(str(ROOT / "assets" / name))[..., ::-1] for name in ("grace_hopper.jpg", "astronaut.png")
    ]
    height, width = LIVE_FRAME
    frames = []
    for index in range(max(10, int(seconds * 30))):
        frame = cv2.resize(photos[index % len(photos)], (width, height), interpolation=cv2.INTER_AREA)
        frames.append(np.ascontiguousarray(np.roll(frame, index % 17, axis=1)))
    return frames


def bench_live(args: argparse.Namespace, device: torch.device, results: dict) -> None:
    """Webcam frames through `Runtime.run("pose", ...)` one after another, as the live tab runs them."""
    from tiny_models import CentreBox

    from sapiens2.runtime.runtime import Runtime

    print("\nlive webcam path: pose 0.4b, one person, 640x480 frames, one frame at a time")
    with tempfile.TemporaryDirectory() as tmp:
        write_checkpoint(Path(tmp), "pose", device, args.cpu_smoke)
        for compiled in (False, True) if args.compile else (False,):
            runtime = Runtime(device=str(device), dtype="bf16", detector=CentreBox(), compile=compiled)
            frames = live_frames(2 if args.cpu_smoke else args.live_seconds)
            start = time.perf_counter()
            runtime.run("pose", frames[0], model=tmp)  # loads the model (and compiles it with --compile)
            first = time.perf_counter() - start
            for frame in frames[1:4]:
                runtime.run("pose", frame, model=tmp)
            latencies, stages = [], []
            start = time.perf_counter()
            for frame in frames[4:]:
                begun = time.perf_counter()
                result = runtime.run("pose", frame, model=tmp)
                latencies.append(time.perf_counter() - begun)
                stages.append(result.timings)
            elapsed = time.perf_counter() - start
            label = "compiled" if compiled else "eager"
            rate = len(latencies) / elapsed
            median = statistics.median(latencies)
            share = {
                stage: statistics.median(getattr(t, stage) for t in stages) * 1e3
                for stage in ("detection", "model", "decode", "pictures")
            }
            print(f"  {label}: first frame {first:.1f} s (load{' and compile' if compiled else ''}), then "
                  f"{rate:.1f} frames/s, {median * 1e3:.1f} ms per frame (median; target >= 20 frames/s); "
                  + ", ".join(f"{stage} {ms:.1f} ms" for stage, ms in share.items()))  # fmt: skip
            results[f"live {label}"] = {
                "first_frame_s": first,
                "frames_per_s": rate,
                "median_ms": median * 1e3,
                "stages_ms": share,
                "frames": len(latencies),
            }
            crop_settings = runtime.settings(tmp, get_kind("pose"))
            del runtime
    crop_ms = person_crop_ms(frames[4], crop_settings)
    size = "x".join(map(str, crop_settings.size))
    print(f"  of the model stage, the person crop on the CPU ({size}): {crop_ms:.1f} ms a frame")
    results["live crop_ms"] = crop_ms
    detector_ms = yolo_ms(device)
    if detector_ms is not None:
        print(
            f"  yolo11n person detection (ultralytics, random weights): {detector_ms:.1f} ms per "
            "640x480 frame"
        )
        results["live yolo11n_ms"] = detector_ms


def person_crop_ms(frame: np.ndarray, settings: Any) -> float:
    """Median ms of the live frame's person crop (the centre box the benchmark's detector gives)."""
    from tiny_models import CentreBox

    from sapiens2.vision.processing import crop_persons

    boxes = CentreBox().detect(frame).boxes_xywh
    times = []
    for _ in range(21):
        start = time.perf_counter()
        crop_persons(frame, boxes, settings)
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times[1:])


def yolo_ms(device: torch.device) -> float | None:
    """Median ms of yolo11n (built from its yaml, no download) on a 640x480 frame, if ultralytics is here."""
    try:
        from ultralytics import YOLO
    except ImportError:
        print("  (ultralytics is not installed here: the person detector's time is not measured)")
        return None
    model = YOLO("yolo11n.yaml")
    frame = np.zeros((*LIVE_FRAME, 3), dtype=np.uint8)
    times = []
    for index in range(23):
        start = time.perf_counter()
        model.predict(frame, device=str(device), verbose=False, classes=[0])
        if index >= 3:
            times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--cpu-smoke", action="store_true", help="tiny models on the CPU, to check the script"
    )
    parser.add_argument("--compile", action="store_true", help="also time our models under torch.compile")
    parser.add_argument(
        "--live", action="store_true", help="also time the live webcam path (pose, one person)"
    )
    parser.add_argument("--kinds", default=",".join(SIZES), help="model kinds to time (default: all)")
    parser.add_argument(
        "--compile-kinds", default="pose", help="the kinds --compile times compiled (default: pose)"
    )
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--live-seconds", type=float, default=10.0, help="frames to time, at 30 per second")
    parser.add_argument("--json", type=Path, help="also write every figure to this JSON file")
    args = parser.parse_args()
    if not args.cpu_smoke and not torch.cuda.is_available():
        sys.exit("bench_cuda.py needs a CUDA GPU; PyTorch sees none (--cpu-smoke checks the script on CPU)")
    device = torch.device("cpu" if args.cpu_smoke else "cuda")
    kinds = [kind.strip() for kind in args.kinds.split(",") if kind.strip()]
    unknown = sorted(set(kinds) - set(SIZES))
    if unknown:
        sys.exit(f"unknown kinds {', '.join(unknown)}; choose among {', '.join(SIZES)}")
    results: dict[str, Any] = {"torch": torch.__version__, "device": str(device)}
    if device.type == "cuda":
        results["gpu"] = torch.cuda.get_device_name()
        print(f"{results['gpu']}, torch {torch.__version__}")
    for kind in kinds:
        bench_kind(kind, args, device, results)
    if args.live:
        bench_live(args, device, results)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
        print(f"\nfigures written to {args.json}")


if __name__ == "__main__":
    main()
