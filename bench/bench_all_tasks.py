"""All tasks on one photo on the CPU, with checkpoints at the official widths (random weights): each task run
on its own, as before (normals and depth run the body-part model again for their background), against
`Runtime.run_all` (they take the body-part task's labels), measured side by side, alternating, models loaded.

    python -m bench.bench_all_tasks [--runs 2] [--mirror DIR] [--photo assets/grace_hopper.jpg]

`--mirror` keeps the checkpoints it writes (about 5 GB, bf16 on disk) for the next run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--mirror", type=Path)
    parser.add_argument("--photo", default=str(ROOT / "assets" / "grace_hopper.jpg"))
    args = parser.parse_args()
    from cpu_space import write_full_size_mirror
    from tiny_models import CentreBox

    mirror = args.mirror or Path(tempfile.mkdtemp(prefix="all-tasks-"))
    from sapiens2.tasks import ALL_TASKS, TASKS

    repo_ids = [TASKS[name].repo_id(TASKS[name].size_or_default(None)) for name in ALL_TASKS]
    write_full_size_mirror(mirror, repo_ids)
    os.environ["SAPIENS2_CHECKPOINT_DIR"] = str(mirror)
    from sapiens2.runtime.runtime import Runtime
    from sapiens2.vision.images import load_image

    runtime = Runtime(device="cpu", detector=CentreBox())
    photo = load_image(args.photo)

    def alone() -> list:
        return [runtime.run(name, photo, size=TASKS[name].size_or_default(None)) for name in ALL_TASKS]

    def shared() -> list:
        return runtime.run_all(photo)

    alone()  # loads every model
    times: dict[str, list[float]] = {"each task alone": [], "run_all (labels shared)": []}
    outputs = {}
    for _ in range(args.runs):
        for label, run in zip(times, (alone, shared), strict=True):
            start = time.perf_counter()
            outputs[label] = run()
            times[label].append(time.perf_counter() - start)
    first, second = (statistics.median(values) for values in times.values())
    print(f"All tasks on {Path(args.photo).name} ({photo.original_size[1]}x{photo.original_size[0]}), "
          f"{', '.join(repo_ids)}, CPU, fp32, median of {args.runs}")  # fmt: skip
    for label, values in times.items():
        print(f"  {label}: {statistics.median(values):.1f} s ({', '.join(f'{v:.1f}' for v in values)})")
    print(f"  ratio {second / first:.2f}")
    before, after = outputs.values()
    for old, new in zip(before, after, strict=True):
        for field in ("background", "foreground"):
            if hasattr(old.prediction, field):
                same = np.array_equal(getattr(old.prediction, field), getattr(new.prediction, field))
                print(f"  {old.task} {field}: {'identical' if same else 'DIFFERENT'}")


if __name__ == "__main__":
    main()
