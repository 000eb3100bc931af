"""The 308 keypoints in other conventions: COCO-17, COCO-WholeBody-133 and OpenPose (BODY_25, hands, face).

Each target point is one 308 point (exact, or the nearest standing in), the mean of several (a midpoint),
or absent (no Goliath point lies near it); the table is sapiens2/data/keypoint_formats.json.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from sapiens2.data.metadata import keypoint_formats_table
from sapiens2.errors import RequestError

NATIVE = "sapiens308"


@dataclass(frozen=True)
class Part:
    """One list of a format (OpenPose's pose, face and hands; COCO's single list): its point names and
    kinds, and for each target point the indices of its source keypoints (none for an absent point)."""

    name: str
    point_names: tuple[str, ...]
    kinds: tuple[str, ...]
    sources: tuple[tuple[int, ...], ...]

    def convert(self, keypoints: np.ndarray, scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(…, targets, 2) points and (…, targets) scores from (…, K, 2) keypoints and (…, K) scores; a
        midpoint is the mean of its sources with the lowest of their scores, an absent point is (0, 0)
        with score 0."""
        keypoints = np.asarray(keypoints, dtype=np.float64)
        scores = np.asarray(scores, dtype=np.float64)
        points = np.zeros(keypoints.shape[:-2] + (len(self.sources), 2))
        converted = np.zeros(scores.shape[:-1] + (len(self.sources),))
        for target, indices in enumerate(self.sources):
            if indices:
                points[..., target, :] = keypoints[..., list(indices), :].mean(axis=-2)
                converted[..., target] = scores[..., list(indices)].min(axis=-1)
        return points, converted


@dataclass(frozen=True)
class KeypointFormat:
    """A keypoint convention: its name, title and parts in order."""

    name: str
    title: str
    parts: tuple[Part, ...]

    @property
    def count(self) -> int:
        return sum(len(part.point_names) for part in self.parts)

    def convert(self, keypoints: np.ndarray, scores: np.ndarray) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """Each part's (points, scores) from the 308 keypoints (…, 308, 2) and scores (…, 308)."""
        return {part.name: part.convert(keypoints, scores) for part in self.parts}


@functools.cache
def _formats(source_names: tuple[str, ...]) -> dict[str, KeypointFormat]:
    index = {name: position for position, name in enumerate(source_names)}
    formats = {}
    for name, entry in keypoint_formats_table()["formats"].items():
        parts = []
        for part_name, points in entry["parts"].items():
            sources = tuple(tuple(index[source] for source in point["from"]) for point in points)
            names = tuple(point["name"] for point in points)
            kinds = tuple(point["kind"] for point in points)
            parts.append(Part(part_name, names, kinds, sources))
        formats[name] = KeypointFormat(name, entry["title"], tuple(parts))
    return formats


FORMAT_NAMES: tuple[str, ...] = tuple(keypoint_formats_table()["formats"])


def _missing(name: str, source_names: Sequence[str]) -> set[str]:
    parts = keypoint_formats_table()["formats"][name]["parts"].values()
    return {source for points in parts for point in points for source in point["from"]} - set(source_names)


def convertible(name: str, source_names: Sequence[str]) -> bool:
    """True when keypoints named `source_names` hold every point the format called `name` is made from."""
    return not _missing(name, source_names)


def keypoint_format(name: str, source_names: Sequence[str]) -> KeypointFormat:
    """The format called `name`, made from keypoints named `source_names` (the 308); a model whose
    keypoints lack a point the format needs (a fine-tuned one) is refused with a sentence."""
    if name not in FORMAT_NAMES:
        raise RequestError(f"Keypoint format must be one of {', '.join(FORMAT_NAMES)}, not {name!r}.")
    missing = _missing(name, source_names)
    if missing:
        raise RequestError(
            f"The {name} keypoint format is made from the 308 Sapiens keypoints; this model's keypoints "
            f"lack {len(missing)} of them (such as {sorted(missing)[0]!r})."
        )
    return _formats(tuple(source_names))[name]
