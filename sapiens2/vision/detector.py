"""Person detection for top-down pose: a small interface and its ultralytics YOLO implementation."""

from __future__ import annotations

import contextlib
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import torch

from sapiens2.errors import Sapiens2Error
from sapiens2.settings import Settings, current, export

# COCO-trained medium detector: the official Sapiens demo detects persons with RTMDet-m (threshold 0.3,
# NMS 0.3); yolo11m is the same size class (COCO box mAP 51.5 against 47.0 for yolo11s), much better on
# small and occluded persons than the nano/small models, and still runs in tens of milliseconds on a GPU
# and a few hundred on a CPU, small next to one forward of the pose model.
DEFAULT_WEIGHTS = "yolo11m.pt"
DEFAULT_MAX_PERSONS = Settings().max_persons
WEIGHTS_ENV = "SAPIENS2_DETECTOR"
MAX_PERSONS_ENV = "SAPIENS2_MAX_PERSONS"
PERSON_CLASS = 0

# Released COCO detection checkpoints (yolo11m.pt, yolov8s.pt, yolo26x.pt, yolov5mu.pt, rtdetr-l.pt, ...).
_MODEL_NAME = re.compile(r"(yolov?\d{1,2}[nsmblxtce]6?u?|rtdetr-[lx])\.pt")


class DetectorError(Sapiens2Error):
    """The person detector cannot be configured, loaded or run."""


@dataclass(frozen=True)
class Detections:
    """Person boxes of one image, best score first.

    boxes_xywh: float32 (N, 4) COCO boxes in image pixels; scores: float32 (N,).
    fallback: nobody was found and the single box is the whole image (score 0).
    found: persons found before the cap; more than N when the cap dropped some.
    """

    boxes_xywh: np.ndarray
    scores: np.ndarray
    fallback: bool = False
    found: int = 0

    @property
    def capped(self) -> bool:
        """True when more persons were found than the detector's cap kept."""
        return self.found > len(self.boxes_xywh)

    def __len__(self) -> int:
        return len(self.boxes_xywh)


class PersonDetector(Protocol):
    """Anything that finds persons in an RGB uint8 (H, W, 3) image."""

    def detect(self, image_rgb: np.ndarray) -> Detections: ...


def select_persons(
    boxes_xyxy: np.ndarray,
    scores: np.ndarray,
    classes: np.ndarray,
    image_size: tuple[int, int],
    max_persons: int = DEFAULT_MAX_PERSONS,
) -> Detections:
    """Keep the person-class boxes, best first, at most max_persons; the whole image when there are none.

    image_size is (height, width).
    """
    person = np.asarray(classes).astype(np.int64) == PERSON_CLASS
    boxes = np.asarray(boxes_xyxy, dtype=np.float32).reshape(-1, 4)[person]
    kept_scores = np.asarray(scores, dtype=np.float32).reshape(-1)[person]
    if len(boxes) == 0:
        height, width = image_size
        whole = np.array([[0.0, 0.0, width, height]], dtype=np.float32)
        return Detections(whole, np.zeros(1, dtype=np.float32), fallback=True, found=0)
    order = np.argsort(-kept_scores, kind="stable")[:max_persons]
    boxes, kept_scores = boxes[order], kept_scores[order]
    xywh = np.concatenate([boxes[:, :2], boxes[:, 2:] - boxes[:, :2]], axis=1)
    return Detections(xywh, kept_scores, fallback=False, found=int(person.sum()))


def resolve_weights(weights: str | os.PathLike | None = None) -> str:
    """The detector checkpoint the operator chose: the argument, else $SAPIENS2_DETECTOR, else the default.

    Accepted: a released ultralytics model name (downloaded by ultralytics on first use) or the path of an
    existing local .pt file of a detector whose class 0 is "person" (COCO order). A .pt is a pickle that
    can run code when loaded, so this must never receive user input.
    """
    choice = str(weights if weights is not None else current().detector or DEFAULT_WEIGHTS).strip()
    if _MODEL_NAME.fullmatch(choice):
        return choice
    path = Path(choice).expanduser()
    if path.suffix == ".pt" and path.is_file():
        return str(path.resolve())
    raise DetectorError(
        f"detector weights {choice!r} are neither an ultralytics model name such as {DEFAULT_WEIGHTS!r} "
        "nor an existing local .pt file"
    )


def max_persons_from_env() -> int:
    """The cap on persons per photo the operator chose: $SAPIENS2_MAX_PERSONS, else 20."""
    return current().max_persons


def _offline() -> bool:
    return current().detector_offline


def _import_ultralytics() -> None:
    """Import ultralytics without its process-wide side effects on a server.

    It would pip-install packages at run time (never wanted on a server) and replaces PIL.Image.open with
    an opener that tries to install pi-heif for any file Pillow cannot identify, which would turn a user's
    junk upload into an install attempt; the original opener is put back.
    """
    export("YOLO_AUTOINSTALL", "false")
    from PIL import Image
    from ultralytics.utils import patches

    Image.open = patches._image_open


def weights_folder() -> Path:
    """Ultralytics' folder for the weights it downloads (`yolo settings` shows it as weights_dir)."""
    from ultralytics.utils import SETTINGS

    return Path(SETTINGS["weights_dir"])


def _remove_empty(folders: list[Path]) -> None:
    """Remove those of `folders` (deepest first) that exist and are empty."""
    for folder in folders:
        with contextlib.suppress(OSError):
            folder.rmdir()


class YoloPersonDetector:
    """Ultralytics YOLO restricted to persons, loaded on first use.

    conf: lowest box score kept; iou: NMS overlap threshold; max_persons: cap on the boxes returned, best
    scores kept (default $SAPIENS2_MAX_PERSONS, else 20); device: a torch device string, or None to let
    ultralytics choose.
    """

    def __init__(
        self,
        weights: str | os.PathLike | None = None,
        conf: float = 0.3,
        iou: float = 0.3,
        max_persons: int | None = None,
        device: str | None = None,
    ) -> None:
        max_persons = max_persons_from_env() if max_persons is None else max_persons
        if max_persons < 1:
            raise DetectorError(f"max_persons must be at least 1, got {max_persons}")
        self.weights = resolve_weights(weights)
        self.conf = conf
        self.iou = iou
        self.max_persons = max_persons
        self.device = device
        self._model = None
        self._lock = threading.Lock()

    def _load(self):
        _import_ultralytics()
        from ultralytics import YOLO

        source = Path(self.weights)
        if not source.is_absolute() and not source.is_file():
            # A released name: keep it in ultralytics' weights folder, not the current directory.
            source = weights_folder() / self.weights
            if not source.is_file() and _offline():
                raise DetectorError(
                    f"{self.weights} is not in {source.parent} and YOLO_OFFLINE forbids downloading it"
                )
        made = [folder for folder in (source.parent, *source.parent.parents) if not folder.exists()]
        try:
            model = YOLO(str(source))
        except Exception as error:
            _remove_empty(made)  # a failed download leaves no empty weights folder behind
            raise DetectorError(f"cannot load detector weights {source}: {error}") from error
        first = model.names.get(PERSON_CLASS)
        if first != "person":
            raise DetectorError(f"class {PERSON_CLASS} of {source} is {first!r}, not 'person' as in COCO")
        return model

    def _predict(self, bgr: np.ndarray):
        # ultralytics lowers torch's thread count for the whole process on its first prediction;
        # keep the count the Sapiens2 models run with.
        threads = torch.get_num_threads()
        try:
            return self._model.predict(bgr, conf=self.conf, iou=self.iou, device=self.device, verbose=False)
        finally:
            torch.set_num_threads(threads)

    def detect(self, image_rgb: np.ndarray) -> Detections:
        """Person boxes in an RGB uint8 (H, W, 3) image."""
        if image_rgb.ndim != 3 or image_rgb.shape[2] != 3 or image_rgb.dtype != np.uint8:
            raise DetectorError(
                f"expected an RGB uint8 (H, W, 3) image, got {image_rgb.dtype} {image_rgb.shape}"
            )
        bgr = np.ascontiguousarray(image_rgb[..., ::-1])  # ultralytics reads numpy images as BGR
        with self._lock:
            if self._model is None:
                self._model = self._load()
                # The first prediction sets ultralytics up and runs with fewer threads (other float sums):
                # it goes to a blank image, so every photo is detected alike, the first one included.
                self._predict(np.zeros((64, 64, 3), dtype=np.uint8))
            result = self._predict(bgr)
        boxes = result[0].boxes
        return select_persons(
            boxes.xyxy.cpu().numpy(),
            boxes.conf.cpu().numpy(),
            boxes.cls.cpu().numpy(),
            image_rgb.shape[:2],
            self.max_persons,
        )
