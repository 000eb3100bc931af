"""What bf16 changes against fp32 on the CPU: output differences per task and the time ratio, same weights.

For each task model, random weights are saved once with transformers (the tests' tiny widths, or the
official 0.4b width and heads), loaded by `sapiens2.from_pretrained` in fp32 and in bf16, and both run on
the example photos at the official 1024x768 input; post-processing runs in fp32 on both outputs, as the
app does. Prints, per task, the relative difference of the raw outputs and what a user would see change:
pose keypoints (shift in pixels of the 1024x768 crop), body-part labels (pixels whose class changes),
surface normals (angle), depth (relative error of z) and matting (alpha), with the median time of each
precision over interleaved runs after one warm-up run each.

    python bench/bench_bf16_cpu.py [--width tiny|0.4b] [--runs 1] [--threads N]

Random weights are not trained ones: a trained pose model's sharp peaks move less than the flat maxima of
a random one, so the keypoint figures here are an upper bound of sorts, and the raw relative differences
are the comparable figures.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from PIL import Image  # noqa: E402
from tiny_models import tiny_config, write_transformers_checkpoint  # noqa: E402

import sapiens2  # noqa: E402
from sapiens2.models import presets  # noqa: E402
from sapiens2.models.device import cpu_has_native_bf16  # noqa: E402
from sapiens2.vision.dense import segmentation_labels  # noqa: E402
from sapiens2.vision.pose_decoding import decode_keypoints  # noqa: E402
from sapiens2.vision.processing import ProcessorSettings, preprocess  # noqa: E402

PHOTOS = [ROOT / "assets" / "grace_hopper.jpg", ROOT / "assets" / "astronaut.png"]
SETTINGS = ProcessorSettings()  # 1024x768, ImageNet normalization
KINDS = {
    "tiny": ("pose", "seg", "normal", "pointmap", "matting"),
    "0.4b": ("pose", "seg", "normal", "pointmap"),
}


def config_for(kind: str, width: str) -> dict:
    if width == "tiny":
        return tiny_config(kind, "1b" if kind == "matting" else "0.4b")
    return copy.deepcopy(presets.preset_config("0.4b", kind))


def compare(kind: str, fp32: object, bf16: object) -> dict[str, str]:
    """The differences a user would see, bf16 against fp32, both post-processed in fp32."""
    if kind == "pose":
        height, width = SETTINGS.size
        boxes = [[0.0, 0.0, width, height]] * len(fp32.heatmaps)
        points = [decode_keypoints(out.heatmaps.float(), boxes)[0] for out in (fp32, bf16)]
        shift = (points[1] - points[0]).norm(dim=-1).flatten()
        # A random model's flat maps can send DARK's Newton step far away: the median and the share of
        # keypoints that moved describe it better than the mean or the largest shift.
        return {
            "keypoint shift, median": f"{shift.median():.2f} px",
            "90th percentile": f"{shift.quantile(0.9):.2f} px",
            "mean of those under 10 px": f"{shift[shift < 10].mean():.2f} px",
            "over 1 px": f"{100 * (shift > 1).float().mean():.1f} %",
            "over 10 px": f"{100 * (shift > 10).float().mean():.1f} %",
        }
    if kind == "seg":
        labels = [segmentation_labels(out.logits.float()) for out in (fp32, bf16)]
        return {"pixels whose class changes": f"{100 * (labels[0] != labels[1]).float().mean():.2f} %"}
    if kind == "normal":
        units = [F.normalize(out.normals.float(), dim=1) for out in (fp32, bf16)]
        angle = torch.rad2deg(torch.acos((units[0] * units[1]).sum(dim=1).clamp(-1, 1)))
        return {
            "normal angle, mean": f"{angle.mean():.2f} deg",
            "99th percentile": f"{angle.flatten().quantile(0.99):.2f} deg",
        }
    if kind == "pointmap":
        depths = [out.pointmaps[:, 2].float() / out.scales.float().view(-1, 1, 1) for out in (fp32, bf16)]
        error = ((depths[1] - depths[0]).abs() / depths[0].abs().clamp_min(1e-6)).flatten()
        # Relative to each pixel's own depth; a random model's depths cross zero, so the median.
        return {
            "depth relative error, median": f"{100 * error.median():.2f} %",
            "90th percentile": f"{100 * error.quantile(0.9):.2f} %",
            "scale": f"{100 * ((bf16.scales - fp32.scales).abs() / fp32.scales.abs()).max():.2f} %",
        }
    alpha = (bf16.alphas.float() - fp32.alphas.float()).abs()
    return {"alpha difference, mean": f"{alpha.mean():.4f}", "max": f"{alpha.max():.3f}"}


def raw_difference(fp32: object, bf16: object) -> float:
    """Largest relative L2 difference among the output's tensor fields."""
    fields = [name for name, value in vars(fp32).items() if isinstance(value, torch.Tensor)]
    return max(
        float((getattr(bf16, name).float() - getattr(fp32, name)).norm() / getattr(fp32, name).norm())
        for name in fields
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", choices=list(KINDS), default="tiny")
    parser.add_argument("--runs", type=int, default=1, help="timed runs of each precision, interleaved")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's choice)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    photos = [np.asarray(Image.open(path).convert("RGB")) for path in PHOTOS]
    pixel_values = preprocess(photos, SETTINGS)
    print(f"{args.width} width, {len(photos)} photos at 1024x768, {torch.get_num_threads()} threads, "
          f"torch {torch.__version__}, native bf16: {cpu_has_native_bf16()}")  # fmt: skip
    for kind in KINDS[args.width]:
        with tempfile.TemporaryDirectory() as directory:
            write_transformers_checkpoint(directory, config_for(kind, args.width))
            models = {
                dtype: sapiens2.from_pretrained(directory, device="cpu", dtype=dtype)
                for dtype in (torch.float32, torch.bfloat16)
            }
        outputs, seconds = {}, {dtype: [] for dtype in models}
        with torch.inference_mode():
            for dtype, model in models.items():  # warm-up: oneDNN builds its kernels for each shape
                outputs[dtype] = model(pixel_values.to(dtype))
            for _ in range(args.runs):
                for dtype, model in models.items():
                    start = time.perf_counter()
                    outputs[dtype] = model(pixel_values.to(dtype))
                    seconds[dtype].append(time.perf_counter() - start)
        fp32, bf16 = outputs[torch.float32], outputs[torch.bfloat16]
        times = {dtype: statistics.median(values) for dtype, values in seconds.items()}
        ratio = times[torch.bfloat16] / times[torch.float32]
        figures = "; ".join(f"{name} {value}" for name, value in compare(kind, fp32, bf16).items())
        fp32_s, bf16_s = times[torch.float32], times[torch.bfloat16]
        print(f"{kind:8} raw relative difference {raw_difference(fp32, bf16):.2e}; {figures}; "
              f"fp32 {fp32_s:.2f} s, bf16 {bf16_s:.2f} s (bf16/fp32 {ratio:.2f})")  # fmt: skip


if __name__ == "__main__":
    main()
