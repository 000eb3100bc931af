"""`sapiens2 all` on a folder of photos on the CPU, with checkpoints at the official widths (random weights):
one request of every task (each batch of photos read once and run through every task; normals and depth take
the body-part task's labels) against one request per task, as the command line ran before (each task reads
every photo again, and normals and depth run the body-part model again), side by side, alternating, with the
models loaded and the same files written.

    python -m bench.bench_cli_all [--runs 2] [--photos 2] [--mirror DIR]

`--mirror` keeps the checkpoints it writes (about 5 GB, bf16 on disk) for the next run.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
PHOTOS = ("grace_hopper.jpg", "astronaut.png")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--photos", type=int, default=2, help="photos in the folder (the examples in turn)")
    parser.add_argument("--mirror", type=Path)
    args = parser.parse_args()
    from cpu_space import write_full_size_mirror
    from tiny_models import CentreBox

    from sapiens2.tasks import ALL_TASKS, TASKS

    mirror = args.mirror or Path(tempfile.mkdtemp(prefix="cli-all-"))
    repo_ids = [TASKS[name].repo_id(TASKS[name].size_or_default(None)) for name in ALL_TASKS]
    write_full_size_mirror(mirror, repo_ids)
    os.environ["SAPIENS2_CHECKPOINT_DIR"] = str(mirror)
    from sapiens2.batch.local import run_locally
    from sapiens2.cli import _checked_arguments, build_parser, request_from_arguments
    from sapiens2.runtime.runtime import Runtime

    work = Path(tempfile.mkdtemp(prefix="cli-all-photos-"))
    folder, warm_up = work / "photos", work / "warm-up-photo"
    for index in range(args.photos):
        name = PHOTOS[index % len(PHOTOS)]
        for place in (folder, warm_up) if index == 0 else (folder,):
            place.mkdir(exist_ok=True)
            shutil.copy(ROOT / "assets" / name, place / f"{index:03d}_{name}")
    runtime = Runtime(device="cpu", detector=CentreBox())

    def request(out: Path, photos: Path = folder):
        cli = build_parser()
        parsed = cli.parse_args(["all", str(photos), "--out", str(out), "--device", "cpu"])
        return request_from_arguments(parsed, _checked_arguments(cli, parsed))

    def per_task(out: Path, photos: Path = folder) -> None:
        everything = request(out, photos)
        for task in everything.tasks:
            run_locally(replace(everything, tasks=(task,)), runtime)

    def together(out: Path) -> None:
        run_locally(request(out), runtime)

    arms = {"one request per task (before)": per_task, "one request of every task": together}
    per_task(work / "warm-up", warm_up)  # loads every model
    times: dict[str, list[float]] = {label: [] for label in arms}
    outs: dict[str, Path] = {}
    for run in range(args.runs):
        for index, (label, arm) in enumerate(arms.items()):
            outs[label] = work / f"out-{index}-{run}"
            start = time.perf_counter()
            arm(outs[label])
            times[label].append(time.perf_counter() - start)
    before, after = (statistics.median(values) for values in times.values())
    print(f"\nsapiens2 all on {args.photos} photos, {', '.join(repo_ids)}, CPU, fp32, median of {args.runs}")
    for label, values in times.items():
        print(f"  {label}: {statistics.median(values):.1f} s ({', '.join(f'{v:.1f}' for v in values)})")
    print(f"  ratio {after / before:.2f}")
    first, second = outs.values()
    names = sorted(path.relative_to(first).as_posix() for path in first.rglob("*") if path.is_file())
    same = [(first / name).read_bytes() == (second / name).read_bytes() for name in names]
    written = sorted(path.relative_to(second).as_posix() for path in second.rglob("*") if path.is_file())
    print(f"  files: {len(names)} and {len(written)}, {sum(same)} identical")


if __name__ == "__main__":
    main()
