"""Ahead-of-time compiled blocks against eager on a GPU: the path a ZeroGPU Space takes at start-up
(`sapiens2.models.aot`: torch.export of each block layout, AOTInductor, each block on its own weights), here
with torch's own AOTInductor, since spaces' helpers need a ZeroGPU worker.

    python bench/bench_aot_cuda.py [--sizes 0.4b 1b] [--batches 1 4] [--json FILE]

Models at the official widths with random weights (built on the GPU, nothing read or written), bf16,
1024x768. Prints the compile time of each size and, per batch, eager and compiled milliseconds per forward
of the backbone with their ratio, and the largest difference of the outputs.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sapiens2.models import aot, presets  # noqa: E402
from sapiens2.models.config import Sapiens2Config  # noqa: E402
from sapiens2.models.modeling import build_model  # noqa: E402

SIZE = (1024, 768)


def timed(model: torch.nn.Module, pixels: torch.Tensor, repeats: int) -> tuple[float, torch.Tensor]:
    """Milliseconds per forward (after two warm-up runs) and the last output."""
    with torch.inference_mode():
        for _ in range(2):
            output = model(pixels).last_hidden_state
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(repeats):
            output = model(pixels).last_hidden_state
        torch.cuda.synchronize()
    return 1000 * (time.perf_counter() - start) / repeats, output


def bench(size: str, batches: list[int], repeats: int) -> dict:
    with torch.device("cuda"):
        model = build_model(Sapiens2Config.from_dict(presets.preset_config(size, "pretrain")))
    model = model.to(torch.bfloat16).eval()
    start = time.perf_counter()
    packages = aot.compile_models([model], [SIZE], aot.local_compiler())
    compile_seconds = time.perf_counter() - start
    rows = []
    for batch in batches:
        pixels = torch.randn(batch, 3, *SIZE, device="cuda", dtype=torch.bfloat16)
        aot.remove_compiled([model])
        eager_ms, eager = timed(model, pixels, repeats)
        blocks = aot.apply_compiled([model], packages, aot.load_package)
        compiled_ms, compiled = timed(model, pixels, repeats)
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
        print(
            f"{size} batch {batch}: eager {eager_ms:.1f} ms, AoT {compiled_ms:.1f} ms, "
            f"x{eager_ms / compiled_ms:.2f}, max |diff| {difference:.3g}",
            flush=True,
        )
    aot.remove_compiled([model])
    return {"size": size, "programs": len(packages), "compile_seconds": compile_seconds, "runs": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=["0.4b", "1b"])
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 4])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("this benchmark needs a CUDA GPU")
    results = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "sizes": []}
    for size in args.sizes:
        results["sizes"].append(bench(size, args.batches, args.repeats))
        print(
            f"{size}: {results['sizes'][-1]['programs']} programs compiled in "
            f"{results['sizes'][-1]['compile_seconds']:.0f} s",
            flush=True,
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
