"""All tasks' zip of one large photo's files: every file deflated at level 1 (as before) against deflated
only where samples of it shrink (`sapiens2/outputs/bundle.py`), measured side by side, alternating.

The files are the real exports of every task for one photo, with tiny random checkpoints (their maps are
noisy, so they compress worse than a real model's smooth ones).

    python -m bench.bench_zip [--height 3000] [--width 4000] [--runs 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from sapiens2.outputs import bundle  # noqa: E402


def task_files(folder: Path, height: int, width: int) -> list[Path]:
    """Every task's files for the example photo resized to width x height."""
    from tiny_models import CentreBox, write_tiny_mirror

    os.environ["SAPIENS2_CHECKPOINT_DIR"] = str(write_tiny_mirror(folder / "hub"))
    from sapiens2.runtime.runtime import Runtime
    from sapiens2.tasks import export_result
    from sapiens2.tasks.registry import ALL_TASKS
    from sapiens2.vision.images import load_image

    photo = np.asarray(
        Image.open(ROOT / "assets" / "grace_hopper.jpg").convert("RGB").resize((width, height))
    )
    runtime = Runtime(device="cpu", dtype="fp32", detector=CentreBox())
    image = load_image(photo)
    files = []
    for task in ALL_TASKS:
        files += export_result(runtime.run(task, image), folder / "out" / task, "photo")
    return files


def everything_deflated(path: Path, files: list[Path], root: Path) -> None:
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=1) as archive:
        for file in files:
            archive.write(file, file.relative_to(root).as_posix())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--height", type=int, default=3000)
    parser.add_argument("--width", type=int, default=4000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        files = task_files(folder, args.height, args.width)
        root = folder / "out"
        total = sum(file.stat().st_size for file in files)
        print(f"{len(files)} files of a {args.width}x{args.height} photo, {total / 1e6:.0f} MB")
        for file in files:
            kind = "deflated" if bundle.member_compression(file) == zipfile.ZIP_DEFLATED else "stored"
            print(f"  {file.relative_to(root)}: {file.stat().st_size / 1e6:.1f} MB, {kind}")
        times: dict[str, list[float]] = {"all deflated": [], "deflated where it pays": []}
        sizes: dict[str, int] = {}
        for run in range(args.runs):
            for label, write in (
                ("all deflated", everything_deflated),
                ("deflated where it pays", bundle.write_zip),
            ):
                path = folder / f"{run}-{label.replace(' ', '_')}.zip"
                start = time.perf_counter()
                write(path, files, root)
                times[label].append(time.perf_counter() - start)
                sizes[label] = path.stat().st_size
                path.unlink()
        for label, values in times.items():
            median = statistics.median(values)
            print(f"{label}: {median:.2f} s (median of {args.runs}), {sizes[label] / 1e6:.0f} MB")
        ratio = statistics.median(times["deflated where it pays"]) / statistics.median(times["all deflated"])
        growth = sizes["deflated where it pays"] / sizes["all deflated"]
        print(f"ours / before: time {ratio:.2f}, size {growth:.2f}")


if __name__ == "__main__":
    main()
