"""The keypoint and body-part metadata files: counts, flip pairs, skeleton, groups, palette."""

import re

import pytest

from sapiens2.data.metadata import body_parts, keypoints308
from sapiens2.errors import ConfigError


def _side_free(name: str) -> str:
    """The name with its side marker (left/right, l/r) and its numbers blanked, to compare mirrored names."""
    name = re.sub(r"(^|_)(left|right|l|r)(?=_|$)", r"\1<side>", name)
    return re.sub(r"\d+", "#", name)


def _side(name: str) -> str | None:
    match = re.search(r"(^|_)(left|right|l|r)(_|$)", name)
    return match.group(2)[0] if match else None


def test_keypoints308_counts_and_unique_names():
    meta = keypoints308()
    assert len(meta.names) == 308
    assert len(set(meta.names)) == 308
    assert len(meta.keypoint_colors) == 308
    assert meta.names[:3] == ("nose", "left_eye", "right_eye")
    assert len(meta.links) == len(meta.link_colors) == 65
    assert all(0 <= c <= 255 for color in meta.keypoint_colors + meta.link_colors for c in color)


def test_flip_pairs_mirror_left_and_right_names():
    meta = keypoints308()
    seen = [i for pair in meta.flip_pairs for i in pair]
    assert len(seen) == len(set(seen)), "a keypoint belongs to at most one pair"
    assert len(meta.flip_pairs) == 146  # 308 keypoints, 16 on the mid-line
    for left, right in meta.flip_pairs:
        a, b = meta.names[left], meta.names[right]
        assert _side_free(a) == _side_free(b), (a, b)
        if _side(a) is not None:
            assert (_side(a), _side(b)) == ("l", "r"), (a, b)
    named = {meta.names[i]: meta.names[j] for i, j in meta.flip_pairs}
    assert named["left_shoulder"] == "right_shoulder"
    assert named["left_thumb4"] == "right_thumb4"
    unpaired = set(range(308)) - set(seen)
    assert all(_side(meta.names[i]) is None for i in unpaired)


def test_links_and_groups_cover_the_skeleton():
    meta = keypoints308()
    assert all(0 <= i < 308 and 0 <= j < 308 and i != j for i, j in meta.links)
    assert set(meta.groups) == {"body", "face", "left_hand", "right_hand"}
    indices = [i for group in meta.groups.values() for i in group]
    assert sorted(indices) == list(range(308))
    assert [len(meta.groups[g]) for g in ("body", "face", "left_hand", "right_hand")] == [30, 238, 20, 20]
    assert all(meta.names[i].startswith("left_") for i in meta.groups["left_hand"])
    assert all(meta.names[i].startswith("right_") for i in meta.groups["right_hand"])
    assert meta.names.index("tip_of_chin") in meta.groups["face"]
    assert meta.names.index("left_wrist") in meta.groups["body"]


def test_body_parts_29_classes_with_palette():
    meta = body_parts()
    assert len(meta.names) == len(meta.palette) == 29
    assert meta.names[0] == "Background"
    assert meta.palette[0] == (50, 50, 50)
    assert meta.names[15] == "Right_Hand" and meta.palette[15] == (255, 0, 0)
    assert len(set(meta.palette)) == 29


def test_metadata_is_cached_and_names_can_be_overridden():
    assert keypoints308() is keypoints308()
    assert body_parts() is body_parts()
    renamed = body_parts().with_names([f"class_{i}" for i in range(29)])
    assert renamed.names[3] == "class_3" and renamed.palette == body_parts().palette
    assert body_parts().names[3] == "Face_Neck"
    with pytest.raises(ConfigError):
        keypoints308().with_names(["only", "two"])
