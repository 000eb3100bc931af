"""Keypoints in the files other tools read: COCO results (COCO-17, COCO-WholeBody) and OpenPose's JSON.

Each point's confidence is its heatmap score (a midpoint takes the lowest of its sources'); a point no
Goliath point stands in for is written as x = y = 0 with confidence 0, as OpenPose writes a missed point.
"""

from __future__ import annotations

import os
import secrets
import shutil
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from sapiens2.outputs.exports import write_json
from sapiens2.outputs.partial_files import make_folder, partial
from sapiens2.vision.keypoint_formats import KeypointFormat, keypoint_format
from sapiens2.vision.pose_decoding import Person

# The file each format is written to, after the photo's stem.
FORMAT_SUFFIXES = {"coco17": "_coco17.json", "wholebody133": "_wholebody.json", "openpose": "_openpose.json"}
# For a video: one COCO results file of every frame; OpenPose's folder of one JSON per frame.
VIDEO_FORMAT_SUFFIXES = {**FORMAT_SUFFIXES, "openpose": "_openpose"}
COCO_PERSON = 1  # category_id of "person" in COCO
OPENPOSE_VERSION = 1.3


def _triplets(points: np.ndarray, scores: np.ndarray) -> list[float]:
    """x0, y0, c0, x1, y1, c1, ... rounded to what a pixel position and a score need."""
    rows = np.concatenate([np.round(points, 2), np.round(scores, 4)[:, None]], axis=1)
    return rows.reshape(-1).tolist()


def coco_image_id(stem: str) -> int | str:
    """The image_id of a photo: its name as a number when it is one (COCO's 000000397133.jpg is 397133),
    else the name itself."""
    return int(stem) if stem.isdigit() else stem


def coco_results(found: KeypointFormat, persons: Sequence[Person], image_id: int | str) -> list[dict]:
    """COCO keypoint results, one per person: keypoints as [x, y, score] * K, the box (x, y, w, h), a
    person score (the box's score times the mean score of the points the format has) and, for a tracked
    person, its track_id."""
    results = []
    for person in persons:
        ((points, scores),) = found.convert(person.keypoints, person.scores).values()
        present = [bool(sources) for sources in found.parts[0].sources]
        mean = float(scores[present].mean()) if any(present) else 0.0
        box_score = 1.0 if person.box_score is None else float(person.box_score)
        result = {
            "image_id": image_id,
            "category_id": COCO_PERSON,
            "keypoints": _triplets(points, scores),
            "score": round(box_score * mean, 4),
            "bbox": np.round(person.box, 2).tolist(),
        }
        if person.track_id is not None:  # PoseTrack's name for it
            result["track_id"] = int(person.track_id)
        results.append(result)
    return results


def openpose_document(found: KeypointFormat, persons: Sequence[Person]) -> dict:
    """OpenPose's per-image JSON: version 1.3, people with the pose (BODY_25), face (70) and hands (21);
    person_id is a tracked person's id, else -1 as OpenPose writes it."""
    people = []
    for person in persons:
        parts = found.convert(person.keypoints, person.scores)
        person_id = -1 if person.track_id is None else int(person.track_id)
        triplets = {name: _triplets(*values) for name, values in parts.items()}
        people.append({"person_id": [person_id], **triplets})
    return {"version": OPENPOSE_VERSION, "people": people}


def write_keypoint_formats(
    directory: str | os.PathLike,
    stem: str,
    persons: Sequence[Person],
    keypoint_names: Sequence[str],
    formats: Sequence[str],
) -> list[Path]:
    """`{stem}_coco17.json`, `{stem}_wholebody.json`, `{stem}_openpose.json`: the chosen formats."""
    written = []
    for name in formats:
        found = keypoint_format(name, keypoint_names)
        if name == "openpose":
            document = openpose_document(found, persons)
        else:
            document = coco_results(found, persons, coco_image_id(stem))
        written += write_json(directory, stem, FORMAT_SUFFIXES[name], document)
    return written


def write_frame_keypoint_formats(
    directory: str | os.PathLike,
    stem: str,
    frames: Sequence[tuple[str, Sequence[Person]]],
    keypoint_names: Sequence[str],
    formats: Sequence[str],
) -> list[Path]:
    """The chosen formats of a video's frames, given as (frame number as text, persons): COCO results with
    the frame number as image_id, and OpenPose's `{stem}_openpose/{stem}_<frame, 12 digits>_keypoints.json`
    as its --write_json names them."""
    written = []
    for name in formats:
        found = keypoint_format(name, keypoint_names)
        if name == "openpose":
            written.append(_write_openpose_frames(Path(directory), stem, found, frames))
        else:
            results = [coco_results(found, persons, int(frame)) for frame, persons in frames]
            written += write_json(directory, stem, FORMAT_SUFFIXES[name], sum(results, []))
    return written


def _write_openpose_frames(
    directory: Path, stem: str, found: KeypointFormat, frames: Sequence[tuple[str, Sequence[Person]]]
) -> Path:
    """The folder of one OpenPose JSON per frame, written under a hidden name and then put in place whole
    (an older folder of the same name is replaced)."""
    target = directory / f"{stem}{VIDEO_FORMAT_SUFFIXES['openpose']}"
    staging = directory / f".{target.name}.{secrets.token_hex(6)}.tmp"
    with partial(staging, make_folder):  # a video without frames still gets its folder
        for frame, persons in frames:
            document = openpose_document(found, persons)
            write_json(staging, f"{stem}_{int(frame):012d}", "_keypoints.json", document)
        if target.is_dir():
            shutil.rmtree(target)
        os.replace(staging, target)
    return target
