"""CPU checkpoint loading: sapiens2.from_pretrained against transformers' from_pretrained, side by side.

Writes a pose checkpoint of a few hundred MB with transformers (official 0.4b width and head, fewer blocks),
then loads it in fresh subprocesses with a warm page cache, touching every weight after the load. Prints the
minimum and median load and load+touch times (wall, and CPU time of all threads, which other processes
disturb less), the peak resident memory the load alone added (as a multiple of the loaded model's own
size; the touch's float32 sums come after it) and the ratios of the medians.

The touch sums every weight in slices of 1M elements. A whole-tensor bf16 sum takes a slower reduction path
in torch for tensors of about 8M elements and more (1.1 ns per element against 0.3-0.6 below), so summing
whole tensors would time how the weights happen to be grouped (a fused feed-forward weight is one such
tensor) rather than reading them.

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
sys.path.insert(0, str(ROOT))

from sapiens2.models.weights import CHUNK_BYTES  # noqa: E402

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
start, cpu_start = time.perf_counter(), time.process_time()
model = load()
loaded = time.perf_counter() - start
peak_load = status("VmHWM") - base
checksum = sum(float(s.sum(dtype=torch.float32)) for p in model.parameters()
               for s in p.detach().reshape(-1).split(1 << 20))
total, cpu = time.perf_counter() - start, time.process_time() - cpu_start
assert next(model.parameters()).dtype == dtype
model_bytes = sum(t.numel() * t.element_size() for t in model.state_dict().values())
print(json.dumps({"load_s": loaded, "load_touch_s": total, "cpu_s": cpu, "peak_load": peak_load / model_bytes,
                  "checksum": checksum}))
"""


def write_checkpoint(directory: Path, layers: int) -> Path:
    """A random fp32 pose model: official 0.4b width and head, `layers` blocks, saved by transformers."""
    import torch
    from transformers import Sapiens2Config, Sapiens2ForPoseEstimation

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


def measure(directory: Path, dtype: str, repeats: int) -> dict[str, dict[str, tuple[float, float]]]:
    """(Minimum, median) of the load time, load+touch time and peak RSS the load added of each loader, runs
    interleaved."""
    runs: dict[str, list[dict]] = {"ours": [], "transformers": []}
    for _ in range(repeats):  # interleaved, so both see the same background load
        for which, results in runs.items():
            results.append(run_child(which, directory, dtype))
    checksums = [r["checksum"] for results in runs.values() for r in results]
    assert max(checksums) - min(checksums) <= 1e-4 * max(map(abs, checksums)), f"weights differ: {checksums}"
    keys = ("load_s", "load_touch_s", "cpu_s", "peak_load")
    return {
        which: {k: (min(r[k] for r in rs), statistics.median(r[k] for r in rs)) for k in keys}
        for which, rs in runs.items()
    }


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
        print(f"{'dtype':8} {'loader':12} {'load s (min, median)':>22} {'load+touch s':>15} "
              f"{'CPU s, all threads':>19} {'peak RSS of the load / model':>30}")  # fmt: skip
        for dtype, target in (("float32", 1.5), ("bfloat16", 1.0)):
            figures = measure(directory, dtype, args.repeats)
            for which, m in figures.items():
                print(f"{dtype:8} {which:12} {m['load_s'][0]:11.3f} {m['load_s'][1]:10.3f} "
                      f"{m['load_touch_s'][0]:7.3f} {m['load_touch_s'][1]:7.3f} "
                      f"{m['cpu_s'][0]:9.3f} {m['cpu_s'][1]:9.3f} "
                      f"{m['peak_load'][0]:14.2f}x {m['peak_load'][1]:14.2f}x")  # fmt: skip
            ratio = {k: figures["ours"][k][1] / figures["transformers"][k][1] for k in figures["ours"]}
            print(f"{dtype:8} ours/ref (medians) {ratio['load_s']:15.2f} {ratio['load_touch_s']:15.2f} "
                  f"{ratio['cpu_s']:19.2f}   "
                  f"(target: load+touch <= {target}; our peak <= 1.1x the model plus one "
                  f"{CHUNK_BYTES >> 20} MB piece a thread)")  # fmt: skip


if __name__ == "__main__":
    main()
