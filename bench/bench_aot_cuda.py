"""Ahead-of-time compiled blocks against eager on a GPU: the path a ZeroGPU Space takes at start-up
(`sapiens2.models.aot`: torch.export of each block layout, AOTInductor, each block on its own weights), here
with torch's own AOTInductor, since spaces' helpers need a ZeroGPU worker.

    python bench/bench_aot_cuda.py [--sizes 0.4b 1b] [--batches 1 4] [--copied-constants] [--json FILE]
    python bench/bench_aot_cuda.py --cpu-smoke  # a tiny backbone on the CPU: checks this script's logic only

Models at the official widths with random weights (built on the GPU, nothing read or written), bf16,
1024x768. Prints the compile time of each size and, per batch, eager and compiled milliseconds per forward
of the backbone with their ratio, and the largest difference of the outputs. Each stage is said as it starts
and a crash prints the Python stack (faulthandler), so a run cut short still shows how far it got.
`--copied-constants` gives each loaded program copies of its block's weights that it owns, where the app
gives it the block's own tensors, to tell the two apart when one fails.
"""

from __future__ import annotations

import argparse
import faulthandler
import functools
import json
import logging
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from sapiens2.models import aot, presets  # noqa: E402
from sapiens2.models.aot import load_package  # noqa: E402
from sapiens2.models.config import Sapiens2Config  # noqa: E402
from sapiens2.models.modeling import build_model  # noqa: E402

SIZE = (1024, 768)


def say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed(model: torch.nn.Module, pixels: torch.Tensor, repeats: int) -> tuple[float, torch.Tensor]:
    """Milliseconds per forward (after two warm-up runs) and the last output."""
    with torch.inference_mode():
        for _ in range(2):
            output = model(pixels).last_hidden_state
        sync(pixels.device)
        start = time.perf_counter()
        for _ in range(repeats):
            output = model(pixels).last_hidden_state
        sync(pixels.device)
    return 1000 * (time.perf_counter() - start) / repeats, output


def bench(size: str, args: argparse.Namespace) -> dict:
    device = torch.device("cpu" if args.cpu_smoke else "cuda")
    config = presets.preset_config(size, "pretrain")
    if args.cpu_smoke:
        from tiny_models import TINY_BACKBONE

        config = {**config, **TINY_BACKBONE}
    image_size = (64, 48) if args.cpu_smoke else SIZE
    with torch.device(device):
        model = build_model(Sapiens2Config.from_dict(config))
    model = model.to(torch.bfloat16).eval()
    load = functools.partial(load_package, copies=args.copied_constants)
    say(f"{size}: exporting and compiling the blocks (each loaded and checked against eager)")
    start = time.perf_counter()
    compiler = aot.Compiler(aot.capture_call, aot.compile_package, load)
    packages = aot.compile_models([model], [image_size], compiler)
    compile_seconds = time.perf_counter() - start
    say(f"{size}: {len(packages)} programs compiled in {compile_seconds:.0f} s")
    rows = []
    for batch in args.batches:
        pixels = torch.randn(batch, 3, *image_size, device=device, dtype=torch.bfloat16)
        aot.remove_compiled([model])
        say(f"{size} batch {batch}: eager")
        eager_ms, eager = timed(model, pixels, args.repeats)
        blocks = aot.apply_compiled([model], packages, load)
        say(f"{size} batch {batch}: compiled blocks (loaded on first use)")
        compiled_ms, compiled = timed(model, pixels, args.repeats)
        assert all(block.compiled_calls for block in blocks), "the compiled blocks were not used"
        difference = (compiled.float() - eager.float()).abs().max().item()
        rows.append(
            {
                "batch": batch,
                "eager_ms": eager_ms,
                "aot_ms": compiled_ms,
                "speedup": eager_ms / compiled_ms,
                "max_abs_difference": difference,
            }
        )
        say(
            f"{size} batch {batch}: eager {eager_ms:.1f} ms, AoT {compiled_ms:.1f} ms, "
            f"x{eager_ms / compiled_ms:.2f}, max |diff| {difference:.3g}"
        )
    aot.remove_compiled([model])
    return {"size": size, "programs": len(packages), "compile_seconds": compile_seconds, "runs": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=["0.4b", "1b"])
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 4])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--copied-constants", action="store_true", help="compiled programs own weight copies")
    parser.add_argument(
        "--cpu-smoke", action="store_true", help="a tiny backbone on the CPU (the logic only)"
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if not args.cpu_smoke and not torch.cuda.is_available():
        sys.exit("this benchmark needs a CUDA GPU (--cpu-smoke checks the script on the CPU)")
    faulthandler.enable()
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s] %(name)s: %(message)s", datefmt="%H:%M:%S")
    gpu = "cpu" if args.cpu_smoke else torch.cuda.get_device_name()
    results = {"gpu": gpu, "torch": torch.__version__, "copied_constants": args.copied_constants, "sizes": []}
    for size in args.sizes:
        results["sizes"].append(bench(size, args))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
