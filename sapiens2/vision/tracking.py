"""Persons followed from frame to frame: each keeps an id while its box and keypoints stay close.

A person of a new frame takes the id of the track it resembles most, the resemblance being the mean of
the boxes' overlap (IoU) and of the keypoints' similarity (COCO's OKS with one spread for every point);
pairs are matched best first, and a pair below `min_similarity` is no match. A track unmatched for more
than `max_missing` frames is closed: a person who comes back later gets a new id.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from sapiens2.vision.pose_decoding import Person

DEFAULT_MAX_MISSING = 30  # frames a track waits for its person (a second at 30 frames per second)
DEFAULT_MIN_SIMILARITY = 0.3
KEYPOINT_SPREAD = 0.1  # OKS's per-point constant k, one value for all 308 points
MIN_BOX_POINTS = 4  # confident keypoints a person needs for a box drawn around them
BOX_MARGIN = 1.2  # keypoints' extent to a detector-like box: joints sit inside the body's outline


@dataclass
class Track:
    """One followed person: its id, the person as last seen, and the frames since it was last matched."""

    id: int
    person: Person
    missing: int = 0


def box_overlap(first: np.ndarray, second: np.ndarray) -> float:
    """Intersection over union of two (x, y, w, h) boxes."""
    x1, y1 = max(first[0], second[0]), max(first[1], second[1])
    x2 = min(first[0] + first[2], second[0] + second[2])
    y2 = min(first[1] + first[3], second[1] + second[3])
    inter = max(0.0, x2 - x1) * max(0.0, y2 - y1)
    union = first[2] * first[3] + second[2] * second[3] - inter
    return float(inter / union) if union > 0 else 0.0


def keypoint_similarity(first: Person, second: Person, threshold: float) -> float:
    """OKS of the keypoints confident in both persons, at the scale of the first one's box; 0 with none."""
    both = (first.scores >= threshold) & (second.scores >= threshold)
    if not both.any():
        return 0.0
    area = max(float(first.box[2] * first.box[3]), 1.0)
    distances = np.sum((first.keypoints[both] - second.keypoints[both]) ** 2, axis=1)
    return float(np.mean(np.exp(-distances / (2 * area * KEYPOINT_SPREAD**2))))


def box_from_keypoints(person: Person, threshold: float, image_size: tuple[int, int]) -> np.ndarray | None:
    """An (x, y, w, h) box around the person's confident keypoints, widened by BOX_MARGIN and kept inside
    the image of `image_size` (height, width); None when fewer than MIN_BOX_POINTS keypoints are confident
    or the box is less than a pixel wide inside the image."""
    confident = (person.scores >= threshold) & np.isfinite(person.keypoints).all(axis=1)
    if confident.sum() < MIN_BOX_POINTS:
        return None
    points = person.keypoints[confident]
    low, high = points.min(axis=0), points.max(axis=0)
    centre, extent = (low + high) / 2, np.maximum(high - low, 1.0) * BOX_MARGIN
    corner = np.array([image_size[1], image_size[0]], dtype=np.float64)
    low, high = np.clip(centre - extent / 2, 0, corner), np.clip(centre + extent / 2, 0, corner)
    if np.any(high - low < 1):
        return None
    return np.concatenate([low, high - low])


class PersonTracker:
    """Gives the persons of each frame, in order, the ids of the tracks they continue (new ids for new
    persons, counted from 1)."""

    def __init__(
        self,
        threshold: float = 0.3,
        max_missing: int = DEFAULT_MAX_MISSING,
        min_similarity: float = DEFAULT_MIN_SIMILARITY,
    ):
        self.threshold = threshold
        self.max_missing = max_missing
        self.min_similarity = min_similarity
        self.tracks: list[Track] = []
        self._next_id = 1

    def similarity(self, track: Track, person: Person) -> float:
        """How much `person` resembles the track's last sight: from 0 (nothing alike) to 1."""
        overlap = box_overlap(track.person.box, person.box)
        return (overlap + keypoint_similarity(track.person, person, self.threshold)) / 2

    def update(self, persons: Sequence[Person], known: Sequence[int] | None = None) -> list[int]:
        """The track id of each of `persons` (one frame's), best matches first; `known`: the ids the persons
        are known to continue (found in boxes drawn around those tracks' keypoints), then nothing is
        matched."""
        ids = self._matched(persons) if known is None else list(known)
        if len(ids) != len(persons):
            raise ValueError(f"{len(persons)} persons but {len(ids)} known ids")
        continued = {track_id for track_id in ids if track_id is not None}
        for track in self.tracks:
            track.missing = 0 if track.id in continued else track.missing + 1
        self.tracks = [track for track in self.tracks if track.missing <= self.max_missing]
        by_id = {track.id: track for track in self.tracks}
        for p, person in enumerate(persons):
            if ids[p] in by_id:
                by_id[ids[p]].person = person
            else:
                ids[p] = self._next_id
                self._next_id += 1
                self.tracks.append(Track(ids[p], person))
        return ids

    def _matched(self, persons: Sequence[Person]) -> list[int | None]:
        """The id of the track each person resembles most, pairs taken best first; None for no match."""
        pairs = sorted(
            (
                (self.similarity(track, person), t, p)
                for t, track in enumerate(self.tracks)
                for p, person in enumerate(persons)
            ),
            key=lambda pair: -pair[0],
        )
        ids: list[int | None] = [None] * len(persons)
        matched: set[int] = set()
        for similarity, t, p in pairs:
            if similarity < self.min_similarity:
                break
            if t in matched or ids[p] is not None:
                continue
            matched.add(t)
            ids[p] = self.tracks[t].id
        return ids

    @property
    def seen(self) -> list[Track]:
        """The tracks matched in the last frame."""
        return [track for track in self.tracks if track.missing == 0]
