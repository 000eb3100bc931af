"""What running a task on one photo gives back: its prediction as plain data, the pictures drawn of it when
asked, timings and notes; and how a task declares the files it writes (`Export`)."""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import astuple, dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar

import numpy as np


@dataclass
class Timings:
    """Seconds spent per stage, summed over the photo's share of a batch: person detection, the model
    (preprocessing included), decoding its outputs onto the photo, and drawing the pictures."""

    detection: float = 0.0
    model: float = 0.0
    decode: float = 0.0
    pictures: float = 0.0

    @contextmanager
    def measure(self, stage: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            setattr(self, stage, getattr(self, stage) + time.perf_counter() - start)

    def share(self, count: int) -> Timings:
        """These timings divided evenly among `count` photos of one batch."""
        return Timings(*(value / count for value in astuple(self)))

    def __add__(self, other: Timings) -> Timings:
        return Timings(*(mine + theirs for mine, theirs in zip(astuple(self), astuple(other), strict=True)))

    @property
    def post(self) -> float:
        """Everything after the model: decoding and pictures."""
        return self.decode + self.pictures

    @property
    def total(self) -> float:
        return sum(astuple(self))


@dataclass
class Prediction:
    """What every task's prediction holds besides its own arrays: the photo it was made from (uint8 RGB at
    its own size, which pictures and coloured files read) and the model that made it (as files name it).
    A prediction is plain data: it pickles and a copy writes the same files."""

    image: np.ndarray
    model_id: str


@dataclass(frozen=True)
class TaskOptions:
    """A task's checked options, one attribute each: every task declares its own subclass, one field per
    option (`sapiens2.pipelines.options.option`); this base holds none (a task without options)."""

    def by_name(self) -> dict[str, Any]:
        """The options by name, as the app, the command line and the API give them."""
        return {item.name: getattr(self, item.name) for item in fields(self)}


P = TypeVar("P", bound=Prediction)
Options = TaskOptions  # what pictures and exports are drawn and written with


@dataclass(frozen=True)
class Export(Generic[P]):
    """One file a task may write from its prediction: the name after the photo's stem (`suffix`, the writer's
    own constant from `sapiens2.outputs.exports`), `write(prediction, options, directory, stem)` returning
    the path written, and `chosen(options)`: whether a run with these options writes it (None: always)."""

    suffix: str
    write: Callable[[P, Options, Path, str], list[Path]]
    chosen: Callable[[Options], bool] | None = None

    @property
    def kind(self) -> str:
        """The file's type, as the command line's --export names it: "json", "png", "npy", "ply", "glb"."""
        return self.suffix.rsplit(".", 1)[-1]

    def wanted(self, options: Options) -> bool:
        return self.chosen is None or self.chosen(options)


Pictures = list[tuple[str, np.ndarray]]  # (title, uint8 RGB picture at the photo's size), in the task's order


@dataclass
class TaskResult:
    """One task's answer for one photo: plain data that pickles (a ZeroGPU fork, a Ray stage, a video's frame
    log). `prediction` is the task's typed prediction; `options` the checked options it was run with (the
    task's TaskOptions; `by_name()` gives their names), which drawing and exports read; `pictures` is empty
    until drawn (`sapiens2.tasks.draw_result`), then holds uint8 RGB pictures at the photo's own size. Files
    come from `sapiens2.tasks.export_result`."""

    task: str
    model_id: str
    prediction: Prediction
    options: TaskOptions = field(default_factory=TaskOptions)
    pictures: Pictures = field(default_factory=list)
    summary: str = ""
    notes: list[str] = field(default_factory=list)
    timings: Timings = field(default_factory=Timings)
    persons: int | None = None  # persons the detector found, for tasks that detect them
    device: str = "cpu"
    dtype: str = "fp32"

    def timing_line(self) -> str:
        """A one-line account of where the time went, with the device, the precision and the model."""
        parts = []
        if self.timings.detection:
            parts.append(f"detection {self.timings.detection:.2f} s")
        parts.append(f"model {self.timings.model:.2f} s")
        parts.append(f"decoding {self.timings.decode:.2f} s")
        parts.append(f"pictures {self.timings.pictures:.2f} s")
        line = " · ".join(parts + [self.device, self.dtype])
        return f"{line[0].upper()}{line[1:]} · {self.model_id}"


class FrameLog(ABC):
    """What a task records of every frame of a video, written as one file beside the video."""

    suffix: ClassVar[str]  # the file's name after the video's stem, e.g. "_predictions.json"

    def __init__(self, options: TaskOptions) -> None:
        self.options = options

    @abstractmethod
    def add(self, frame: str, result: TaskResult) -> None:
        """Record one frame's result under the frame's name."""

    @abstractmethod
    def write(self, directory: Path, stem: str) -> Path:
        """Write the record as directory/{stem}{suffix}; returns its path."""

    @classmethod
    def format_suffixes(cls, options: TaskOptions) -> tuple[str, ...]:
        """The other files (or folders) the task's `options` ask for beside the record, after the stem."""
        return ()

    def write_formats(self, directory: Path, stem: str) -> list[Path]:
        """Write the files of format_suffixes; returns their paths."""
        return []


class FrameFollower(ABC):
    """What a task carries from one frame of a video (or of a live stream) to the next: pose's tracks.

    For each frame in order: `given()` is what the frame's run starts with (Runtime.run's `given`), then
    `follow(rgb, result, dt)` turns the frame's result into the one shown and recorded, `dt` seconds after
    the frame before. `options`: the task's and its video options, checked, by name. `batched`: each
    model call is costly (it crosses to a GPU worker), so frames must go through the model in batches and
    the follower does without what would need them one at a time.
    """

    def __init__(self, options: Mapping[str, Any], batched: bool = False) -> None:
        self.options = options
        self.batched = batched

    @property
    def sequential(self) -> bool:
        """True when each frame's run needs the frame before followed first (frames go one at a time)."""
        return False

    def given(self) -> dict[str, Any] | None:
        """The values the next frame's run starts with; None: a run like any photo's."""
        return None

    @abstractmethod
    def follow(self, rgb: np.ndarray, result: TaskResult, dt: float) -> TaskResult:
        """The result of the frame `rgb` (RGB at its own size) with what the frames before tell; its pictures,
        if any were drawn, are left out, to be drawn of the result followed."""

    @property
    def notes(self) -> list[str]:
        """What the user should know about the frames followed so far."""
        return []
