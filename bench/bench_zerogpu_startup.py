"""What a ZeroGPU Space's start-up costs: the default models loaded on the CPU, moved to emulated CUDA and
packed by the real `spaces` package, timed and measured in memory, at the official sizes (random weights).

    python bench/bench_zerogpu_startup.py [--folder DIR] [--dtype bf16]

Writes real-size random checkpoints of every default model (about 11 GB in fp32, once, into --folder),
then, in a fresh interpreter under SPACES_ZERO_GPU with a stand-in device API, runs what `app.py` runs
before launch (`sapiens2.serving.zerogpu.serve`) and what spaces runs at launch (`spaces.zero.torch.pack`).
Prints seconds and peak resident memory of each part, as JSON.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

CHILD = r"""
import json, resource, sys, time
import spaces  # first: patches torch under SPACES_ZERO_GPU
from spaces.zero.torch import pack
from sapiens2.runtime import Runtime
from sapiens2.serving import zerogpu

def peak_gb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20

start = time.perf_counter()
runtime = Runtime(dtype=sys.argv[1])
hosting = zerogpu.serve(runtime)
loaded = time.perf_counter()
peak_loaded = peak_gb()
packed_bytes = pack()
done = time.perf_counter()
print(json.dumps({
    "device": runtime.device_label, "dtype": runtime.dtype_label, "models": len(hosting.resident),
    "model_gb": runtime.cache.bytes_held / 1e9, "packed_gb": packed_bytes / 1e9,
    "load_and_move_s": round(loaded - start, 1), "pack_s": round(done - loaded, 1),
    "peak_rss_gb_after_load": round(peak_loaded, 2), "peak_rss_gb": round(peak_gb(), 2),
}))
"""


def write_checkpoints(folder: Path) -> None:
    from tiny_models import repo_task_size, write_transformers_checkpoint

    from sapiens2.models.presets import preset_config
    from sapiens2.serving.zerogpu import default_models

    for repo_id in default_models():
        directory = folder / repo_id
        if (directory / "model.safetensors").is_file():
            continue
        task, size = repo_task_size(repo_id)
        print(f"writing {repo_id} ...", file=sys.stderr, flush=True)
        write_transformers_checkpoint(directory, preset_config(size, task))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--folder", type=Path, default=Path(tempfile.gettempdir()) / "sapiens2-real-size")
    parser.add_argument("--dtype", default="bf16")
    args = parser.parse_args()
    write_checkpoints(args.folder)

    from zerogpu_api import DeviceApi, serve

    http, url = serve(DeviceApi())
    environment = dict(
        os.environ,
        SPACES_ZERO_GPU="true",
        SPACES_ZERO_DEVICE_API_URL=url,
        ZEROGPU_OFFLOAD_DIR=str(args.folder / "offload"),
        SAPIENS2_CHECKPOINT_DIR=str(args.folder),
        HF_HUB_OFFLINE="1",
        PYTHONPATH=str(ROOT),
    )
    command = [sys.executable, "-c", CHILD, args.dtype]
    answer = subprocess.run(command, env=environment, capture_output=True, text=True, check=False)
    http.shutdown()
    if answer.returncode != 0:
        sys.exit(answer.stderr[-4000:])
    print(answer.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    main()
