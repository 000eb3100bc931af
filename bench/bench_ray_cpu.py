"""Photos per second of `--ray` against the command line without it, on the same photos and machine.

Tiny random checkpoints run at the official 1024x768 input size on 1024x768 photos, so decoding, resizing,
post-processing and writing weigh as they do with real models while the forward itself is small: the
figures show the cost of the Ray path around the model, the part that has to stay small. Each setup runs
once on 1 photo and once on N: (wall N - wall 1) / (N - 1) is the cost of one more photo, wall 1 the fixed
cost (process start, model load, for Ray the actors' start). Then the same on a simulated cluster of two
nodes on this machine (ray.cluster_utils.Cluster), splitting its CPUs.

    python bench/bench_ray_cpu.py --photos 48 --task segment
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("YOLO_OFFLINE", "1")

import numpy as np  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
import ray  # noqa: E402
from PIL import Image  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402
from tiny_models import repo_task_size, write_few_persons_yolo, write_tiny_checkpoint  # noqa: E402

from sapiens2.cli import main  # noqa: E402
from sapiens2.tasks.registry import get_task  # noqa: E402


def make_photos(folder: Path, count: int) -> None:
    """`count` 1024x768 portrait JPEGs from the two example photos, each shifted and mirrored its own way."""
    sources = [
        Image.open(ROOT / "assets" / name).convert("RGB") for name in ("grace_hopper.jpg", "astronaut.png")
    ]
    for index in range(count):
        photo = sources[index % 2].resize((768 + 8 * (index % 5), 1024 + 8 * (index % 7)))
        photo = photo.crop((index % 5, index % 7, index % 5 + 768, index % 7 + 1024))
        if index % 3 == 0:
            photo = photo.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        sub = folder / f"set{index % 4}"
        sub.mkdir(parents=True, exist_ok=True)
        photo.save(sub / f"photo{index:04d}.jpg", quality=90)


def run(argv: list[str]) -> float:
    """Wall seconds of the command line (its printing kept quiet)."""
    start = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        status = main(argv)
    assert status == 0, status
    return time.perf_counter() - start


def marginal(command: list[str], photos: Path, one: Path, out: Path, count: int) -> tuple[float, float]:
    """(fixed seconds, seconds per photo) of a command from a run on one photo and a run on `count`."""
    fixed = run([command[0], str(one), "--out", str(out / "one"), *command[1:]])
    full = run([command[0], str(photos), "--out", str(out / "all"), *command[1:]])
    return fixed, (full - fixed) / (count - 1)


def stage_seconds(out: Path, task: str) -> dict[str, float]:
    """Mean seconds per photo of each stage, from the predictions table."""
    seconds = pq.read_table(out / "all" / "predictions" / task, columns=["seconds"]).column("seconds")
    table = seconds.combine_chunks().flatten()
    return {field.name: float(np.mean(column)) for field, column in zip(seconds.type, table, strict=True)}


def main_bench() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--photos", type=int, default=48)
    parser.add_argument("--task", default="segment", choices=["segment", "pose", "normals", "depth"])
    parser.add_argument("--batch-size", type=int, default=4)
    args = parser.parse_args()
    cpus = os.cpu_count() or 2
    print(f"load average before: {' '.join(f'{v:.2f}' for v in os.getloadavg())}; {cpus} CPUs")
    work = Path(tempfile.mkdtemp(prefix="bench-ray-"))
    try:
        hub = work / "hub"
        for repo_id in get_task(args.task).repo_ids_needed(None):
            kind, size = repo_task_size(repo_id)
            write_tiny_checkpoint(hub / repo_id, kind, size=size)
        detector = write_few_persons_yolo(work / "detector.pt")
        photos, one = work / "photos", work / "one"
        make_photos(photos, args.photos)
        one.mkdir()
        shutil.copy(next(photos.rglob("*.jpg")), one / "photo.jpg")
        common = ["--checkpoint-dir", str(hub), "--detector", detector, "--device", "cpu"]
        common += ["--batch-size", str(args.batch_size)]
        results = {}
        results["plain"] = marginal([args.task, *common], photos, one, work / "plain", args.photos)

        ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=False)
        ray.data.DataContext.get_current().enable_progress_bars = False
        results["ray, 1 node"] = marginal(
            [args.task, *common, "--ray"], photos, one, work / "ray1", args.photos
        )
        stages_one = stage_seconds(work / "ray1", args.task)
        ray.shutdown()

        cluster = Cluster(
            initialize_head=True, head_node_args={"num_cpus": cpus // 2, "include_dashboard": False}
        )
        cluster.add_node(num_cpus=cpus - cpus // 2)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, log_to_driver=False)
        ray.data.DataContext.get_current().enable_progress_bars = False
        two = [args.task, *common, "--ray", "--actors", "2,2"]
        results["ray, 2 simulated nodes"] = marginal(two, photos, one, work / "ray2", args.photos)
        stages_two = stage_seconds(work / "ray2", args.task)
        ray.shutdown()
        cluster.shutdown()
    finally:
        shutil.rmtree(work, ignore_errors=True)

    plain_rate = 1 / results["plain"][1]
    print(
        f"\n{args.task}, {args.photos} photos 1024x768, tiny checkpoints at 1024x768, batch {args.batch_size}"
    )
    print(f"{'setup':<24} {'fixed s':>8} {'s/photo':>8} {'photos/s':>9} {'vs plain':>9}")
    for name, (fixed, per_photo) in results.items():
        rate = 1 / per_photo
        print(f"{name:<24} {fixed:8.2f} {per_photo:8.3f} {rate:9.2f} {rate / plain_rate:8.0%}")
    for name, stages in (("1 node", stages_one), ("2 simulated nodes", stages_two)):
        line = " · ".join(f"{stage} {value:.3f}" for stage, value in stages.items())
        print(f"seconds per photo by stage, {name}: {line}")
    print(f"load average after: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")


if __name__ == "__main__":
    main_bench()
