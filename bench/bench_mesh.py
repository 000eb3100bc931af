"""Time and size of the depth task's geometry exports for one large photo: the full .glb mesh, the viewer's
mesh, the camera fit and the 16-bit depth and normals PNGs.

No model runs: a smooth synthetic pointmap (a person-sized bulge 2 m away, seen through a camera whose focal
length is the photo's width) stands in for the model's, with a foreground covering `--foreground` of the
photo. Prints the median of `--runs` runs per writer and the size of what it wrote.

    python -m bench.bench_mesh [--height 3000] [--width 4000] [--foreground 0.4] [--runs 3]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from sapiens2.outputs import exports
from sapiens2.vision.intrinsics import fit_intrinsics


def scene(height: int, width: int, share: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rows, columns = np.mgrid[0:height, 0:width].astype(np.float32)
    rays = np.dstack([(columns - width / 2) / width, (rows - height / 2) / width, np.ones_like(rows)])
    bulge = 2.0 - 0.2 * np.exp(-(((columns - width / 2) / (0.2 * width)) ** 2))
    points = rays * bulge[..., None]
    image = np.dstack([rows * 255 / height, columns * 255 / width, np.full_like(rows, 90)]).astype(np.uint8)
    foreground = np.zeros((height, width), bool)
    half = int(share * width / 2)
    foreground[:, width // 2 - half : width // 2 + half] = True
    return points, image, foreground


def fit_camera(points: np.ndarray, foreground: np.ndarray) -> list[Path]:
    fit_intrinsics(points, foreground)
    return []


def timed(runs: int, write) -> tuple[float, list[Path]]:
    seconds, paths = [], []
    for _ in range(runs):
        start = time.perf_counter()
        paths = write()
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds), paths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--height", type=int, default=3000)
    parser.add_argument("--width", type=int, default=4000)
    parser.add_argument("--foreground", type=float, default=0.4)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    pointmap = scene(args.height, args.width, args.foreground)
    points, _, foreground = pointmap
    depth = points[..., 2]
    across, down = np.gradient(points, axis=1), np.gradient(points, axis=0)
    normals = np.cross(down, across)
    normals /= np.linalg.norm(normals, axis=2, keepdims=True)
    with tempfile.TemporaryDirectory() as folder:
        writers = {
            "mesh (.glb, full resolution)": lambda: exports.write_mesh(folder, "a", *pointmap),
            "viewer mesh (.glb)": lambda: [exports.write_mesh_preview(folder, "a", *pointmap)],
            "camera fit": lambda: fit_camera(points, foreground),
            "depth, 16-bit PNG": lambda: exports.write_depth_png(
                folder, "a", depth, exports.depth_png_scale(depth)
            ),
            "normals, 16-bit PNG": lambda: exports.write_normals_png(folder, "a", normals),
            "point cloud (.ply), for comparison": lambda: exports.write_point_cloud(folder, "a", *pointmap),
        }
        print(f"{args.width}x{args.height}, foreground {args.foreground:.0%}, median of {args.runs} runs")
        for name, write in writers.items():
            seconds, paths = timed(args.runs, write)
            size = sum(path.stat().st_size for path in paths)
            print(f"{name:36} {seconds * 1000:8.0f} ms {size / 1e6:9.1f} MB")
        camera = fit_intrinsics(points, foreground)
        print(f"fitted: {camera} (true: fx = fy = {args.width}, centre at the middle)")


if __name__ == "__main__":
    main()
