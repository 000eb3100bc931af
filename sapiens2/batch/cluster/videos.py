"""Videos with --ray: each video is one Ray task that runs it frame by frame through the engine the command
line uses without --ray (tracking, smoothing and motion capture follow persons from one frame to the next,
so a video is never split), writing the same files under the same names. Its frames and its files are local
to the worker: the video and the output folder must be local paths (or file:// URIs) that every node sees.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import ray

from sapiens2.batch.cluster.storage import Found, Place
from sapiens2.batch.cluster.worker import start_worker
from sapiens2.batch.inputs import Source
from sapiens2.batch.local import Run
from sapiens2.batch.report import Report
from sapiens2.batch.request import BatchRequest
from sapiens2.runtime import Runtime
from sapiens2.settings import Settings

NOT_LOCAL = (
    "Videos run with --ray from a local path into a local output folder (or file:// URIs), one video per "
    "Ray task; run this one without --ray, or copy it to a folder every node sees."
)


def runs_here(item: Found, out: Place) -> bool:
    """True when the video can run on Ray: it and the output folder are local paths."""
    return item.file.is_local and out.is_local


def run_videos(
    request: BatchRequest, videos: list[tuple[Found, tuple[str, str]]], settings: Settings, gpus: bool
) -> Report:
    """Run every video (with its output folder and stem) as one Ray task, `gpus`: one GPU each; the reports
    of all of them as one, in the videos' order."""
    one_video = ray.remote(num_cpus=1, num_gpus=1 if gpus else 0)(_run_video)
    sources = [
        Source(Path(item.file.path), item.label, Path(directory), stem) for item, (directory, stem) in videos
    ]
    alone = replace(request, cluster=None, inputs=())  # each worker runs its one source without Ray
    report = Report()
    runs = [one_video.remote(alone, settings, source) for source in sources]
    for source, done in zip(sources, runs, strict=True):
        try:
            part = ray.get(done)
        except ray.exceptions.RayError as error:  # its worker died, or the run failed before its first frame
            report.fail(source.label, getattr(error, "cause", None) or error)
            continue
        report.written += part.written
        report.kept += part.kept
        report.succeeded += part.succeeded
        report.failures += part.failures
        report.videos += part.videos
    return report


def _run_video(request: BatchRequest, settings: Settings, source: Source) -> Report:
    """One video through every task of the request, in a Ray worker, with a runtime of its own."""
    start_worker(settings)
    runtime = Runtime(
        device=request.device,
        dtype=request.dtype,
        detector=request.detector,
        batch_size=request.batch_size,
        compile=request.compile,
        setup=settings,
    )
    run = Run(runtime, request)
    for task in request.tasks:
        run.task(task, [source])
    return run.report
