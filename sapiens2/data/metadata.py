"""Keypoint and body-part metadata of the Sapiens2 tasks, loaded from the JSON files in sapiens2/data."""

from __future__ import annotations

import colorsys
import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import MappingProxyType

from sapiens2.errors import ConfigError

_DATA = Path(__file__).parent

RGB = tuple[int, int, int]


@dataclass(frozen=True)
class KeypointMeta:
    """Names, flip pairs, skeleton and RGB colours of a keypoint set; groups map a body region to indices."""

    names: tuple[str, ...]
    flip_pairs: tuple[tuple[int, int], ...]
    links: tuple[tuple[int, int], ...]
    link_colors: tuple[RGB, ...]
    keypoint_colors: tuple[RGB, ...]
    groups: Mapping[str, tuple[int, ...]]

    def with_names(self, names: Sequence[str]) -> KeypointMeta:
        """The same metadata with other keypoint names (e.g. a checkpoint's id2label), same count."""
        return dataclasses.replace(self, names=_checked_names(names, len(self.names)))

    def __reduce__(self) -> tuple:
        # Pickled with its groups as a plain dict: a mappingproxy does not pickle.
        values = {item.name: getattr(self, item.name) for item in dataclasses.fields(self)}
        return _keypoint_meta, (values | {"groups": dict(self.groups)},)


def _keypoint_meta(values: dict) -> KeypointMeta:
    return KeypointMeta(**(values | {"groups": MappingProxyType(values["groups"])}))


@dataclass(frozen=True)
class BodyPartMeta:
    """Class names of a body-part segmentation and their RGB palette; class 0 is the background."""

    names: tuple[str, ...]
    palette: tuple[RGB, ...]

    def with_names(self, names: Sequence[str]) -> BodyPartMeta:
        """The same metadata with other class names (e.g. a checkpoint's id2label), same count."""
        return dataclasses.replace(self, names=_checked_names(names, len(self.names)))


def _checked_names(names: Sequence[str], count: int) -> tuple[str, ...]:
    if len(names) != count:
        raise ConfigError(f"expected {count} names, got {len(names)}")
    return tuple(str(name) for name in names)


def _pairs(rows: list[list[int]]) -> tuple[tuple[int, int], ...]:
    return tuple((int(a), int(b)) for a, b in rows)


def _colors(rows: list[list[int]]) -> tuple[RGB, ...]:
    return tuple((int(r), int(g), int(b)) for r, g, b in rows)


@cache
def keypoints308() -> KeypointMeta:
    """The 308 keypoints of Sapiens2 pose (Goliath set without teeth)."""
    data = json.loads((_DATA / "keypoints308.json").read_text())
    return KeypointMeta(
        names=tuple(data["names"]),
        flip_pairs=_pairs(data["flip_pairs"]),
        links=_pairs(data["links"]),
        link_colors=_colors(data["link_colors"]),
        keypoint_colors=_colors(data["keypoint_colors"]),
        groups=MappingProxyType({group: tuple(indices) for group, indices in data["groups"].items()}),
    )


@cache
def body_parts() -> BodyPartMeta:
    """The 29 body-part classes of Sapiens2 segmentation with the official palette."""
    data = json.loads((_DATA / "body_parts.json").read_text())
    return BodyPartMeta(names=tuple(data["names"]), palette=_colors(data["palette"]))


WHOLE_PERSON = "whole person"  # the group of every class but the first (the background), for any model


@cache
def part_groups() -> Mapping[str, tuple[str, ...]]:
    """Named groups of body-part classes offered beside the classes themselves ("whole person" first, then
    body_part_presets.json's "face", "hands", "clothing", "skin"), each as its official class names."""
    data = json.loads((_DATA / "body_part_presets.json").read_text())
    groups = {WHOLE_PERSON: body_parts().names[1:]}
    groups.update((name, tuple(members)) for name, members in data["presets"].items())
    return MappingProxyType(groups)


def palette(count: int) -> tuple[RGB, ...]:
    """`count` distinct colours: the body-part palette's first ones, then evenly spread hues."""
    colours = list(body_parts().palette[:count])
    for index in range(len(colours), count):
        hue = (index * 0.618034) % 1.0
        colours.append(_hsv_to_rgb(hue, 0.78, 0.9))
    return tuple(colours)


def _hsv_to_rgb(hue: float, saturation: float, value: float) -> RGB:
    red, green, blue = colorsys.hsv_to_rgb(hue, saturation, value)
    return round(255 * red), round(255 * green), round(255 * blue)


def keypoint_set(
    names: Sequence[str], flip_pairs: Sequence[Sequence[int]] = (), links: Sequence[Sequence[int]] = ()
) -> KeypointMeta:
    """Metadata of a keypoint set other than the 308 (a fine-tuned model's), coloured from `palette`."""
    colours = palette(max(len(names), len(links)))
    return KeypointMeta(
        names=tuple(str(name) for name in names),
        flip_pairs=_pairs([list(pair) for pair in flip_pairs]),
        links=_pairs([list(link) for link in links]),
        link_colors=colours[: len(links)],
        keypoint_colors=colours[: len(names)],
        groups=MappingProxyType({}),
    )


def class_set(names: Sequence[str], colours: Sequence[Sequence[int]] | None = None) -> BodyPartMeta:
    """Metadata of segmentation classes other than the 29 body parts (a fine-tuned model's)."""
    colours = palette(len(names)) if colours is None else _colors([list(colour) for colour in colours])
    return BodyPartMeta(names=tuple(str(name) for name in names), palette=tuple(colours))


@cache
def keypoint_formats_table() -> Mapping:
    """The table of keypoint_formats.json: each format's parts, and for each point its 308 sources."""
    return json.loads((_DATA / "keypoint_formats.json").read_text())


@cache
def openpose_style() -> Mapping:
    """OpenPose's drawing as data (openpose_style.json): limbs, joint and limb colours, sizes."""
    return json.loads((_DATA / "openpose_style.json").read_text())
