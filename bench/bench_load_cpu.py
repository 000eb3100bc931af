"""CPU checkpoint loading: sapiens2.from_pretrained against transformers' from_pretrained, side by side.

Writes a pose checkpoint of a few hundred MB with transformers (official 0.4b width and head, fewer blocks),
then loads it in fresh subprocesses with a warm page cache, touching every weight after the load. Prints the
median load time, the peak resident memory the load added (as a multiple of the file size) and the ratios.

    python bench/bench_load_cpu.py [--layers 8] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Runs in a fresh interpreter: imports first, then the peak-RSS mark is reset, then load + touch is timed.
CHILD = r"""
import json, sys, time
import torch
which, directory, dtype_name = sys.argv[1:4]
dtype = getattr(torch, dtype_name)
if which == "ours":
    import sapiens2
    load = lambda: sapiens2.from_pretrained(directory, device="cpu", dtype=dtype)
else:
    import transformers
    from transformers import Sapiens2ForPoseEstimation
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    load = lambda: Sapiens2ForPoseEstimation.from_pretrained(directory, dtype=dtype)

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024

with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # resets VmHWM to the current resident size
base = status("VmRSS")
start = time.perf_counter()
model = load()
loaded = time.perf_counter() - start
checksum = sum(float(p.sum(dtype=torch.float32)) for p in model.parameters())
total = time.perf_counter() - start
assert next(model.parameters()).dtype == dtype
print(json.dumps({"load_s": loaded, "load_touch_s": total, "peak_added": status("VmHWM") - base,
                  "checksum": checksum}))
"""


def write_checkpoint(directory: Path, layers: int) -> Path:
    """A random fp32 pose model: official 0.4b width and head, `layers` blocks, saved by transformers."""
    import torch
    from transformers import Sapiens2Config, Sapiens2ForPoseEstimation

    sys.path.insert(0, str(ROOT))
    from sapiens2.models.presets import preset_config

    preset = preset_config("0.4b", "pose")
    fields = {k: v for k, v in preset.items() if k not in ("architectures", "model_type")}
    fields["num_hidden_layers"] = layers
    torch.manual_seed(0)
    model = Sapiens2ForPoseEstimation(Sapiens2Config(**fields))
    model.save_pretrained(directory)
    return directory / "model.safetensors"


def run_child(which: str, directory: Path, dtype: str) -> dict:
    result = subprocess.run(
        [sys.executable, "-c", CHILD, which, str(directory), dtype],
        check=True, capture_output=True, text=True, cwd=ROOT,
    )  # fmt: skip
    return json.loads(result.stdout.strip().splitlines()[-1])


def measure(directory: Path, dtype: str, repeats: int) -> dict[str, dict[str, float]]:
    """Median load time, load+touch time and peak RSS added of each loader, runs interleaved."""
    runs: dict[str, list[dict]] = {"ours": [], "transformers": []}
    for _ in range(repeats):  # interleaved, so both see the same background load
        for which, results in runs.items():
            results.append(run_child(which, directory, dtype))
    checksums = [r["checksum"] for results in runs.values() for r in results]
    assert max(checksums) - min(checksums) <= 1e-4 * max(map(abs, checksums)), f"weights differ: {checksums}"
    keys = ("load_s", "load_touch_s", "peak_added")
    return {which: {k: statistics.median(r[k] for r in rs) for k in keys} for which, rs in runs.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=8, help="transformer blocks (24 is the real 0.4b)")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        weights = write_checkpoint(directory, args.layers)
        size = weights.stat().st_size
        weights.read_bytes()  # warm the page cache
        print(f"checkpoint: {size / 1e6:.0f} MB fp32, hidden 1024, {args.layers} blocks, 0.4b pose head")
        print(f"{'dtype':8} {'loader':12} {'load s':>8} {'load+touch s':>13} {'peak RSS added':>15}")
        for dtype in ("float32", "bfloat16"):
            medians = measure(directory, dtype, args.repeats)
            for which, m in medians.items():
                print(f"{dtype:8} {which:12} {m['load_s']:8.3f} {m['load_touch_s']:13.3f} "
                      f"{m['peak_added'] / size:14.2f}x")  # fmt: skip
            ratio = {k: medians["ours"][k] / medians["transformers"][k] for k in medians["ours"]}
            print(f"{dtype:8} ours/ref     {ratio['load_s']:8.2f} {ratio['load_touch_s']:13.2f} "
                  f"{ratio['peak_added']:14.2f}x  (targets: time <= 1, RSS <= 1.3x file)")  # fmt: skip


if __name__ == "__main__":
    main()
