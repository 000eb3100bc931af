"""Tasks over millions of photos on a Ray cluster: `sapiens2 TASK INPUT... --out URI --ray [ADDRESS]`.

The task's pipeline (`sapiens2.pipelines.steps`) runs as Ray Data stages, each sized on its own: read bytes,
decode and preprocess on CPU workers, model forwards in actor pools, post-processing and per-photo files
on CPU workers, and Parquet tables of predictions and failures. Ray is imported only from here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sapiens2.batch.request import BatchRequest

INSTALL_HINT = "pip install -r requirements-scale.txt (or pip install 'sapiens2[scale]')"


def missing_ray() -> ImportError | None:
    """Why Ray Data cannot be imported here, or None when it can."""
    try:
        import ray.data  # noqa: F401
    except ImportError as error:
        return error
    return None


def run_on_ray(request: BatchRequest) -> int:
    """Run the request on Ray Data; returns the exit status."""
    from sapiens2.batch.cluster.run import run

    return run(request)
