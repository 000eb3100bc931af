"""Tasks over millions of photos on a Ray cluster: `sapiens2 TASK INPUT... --out URI --ray [ADDRESS]`.

The task's pipeline (`sapiens2.pipelines.steps`) runs as Ray Data stages, each sized on its own: read bytes,
decode and preprocess on CPU workers, model forwards in actor pools, post-processing and per-photo files
on CPU workers, and Parquet tables of predictions and failures. Ray is imported only from here.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..tasks import Task

INSTALL_HINT = "pip install -r requirements-scale.txt (or pip install 'sapiens2[scale]')"


def run_on_ray(parser: argparse.ArgumentParser, args: argparse.Namespace, tasks: Sequence[Task]) -> int:
    """The command line's --ray: its exit status; a usage error when Ray Data is not installed."""
    try:
        import ray.data  # noqa: F401
    except ImportError as error:
        parser.error(f"--ray needs Ray Data, which is not installed ({error}). Install it: {INSTALL_HINT}")
    from .run import run

    return run(args, tasks)
