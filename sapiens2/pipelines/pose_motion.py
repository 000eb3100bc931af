"""Pose in videos turned into motion: the option asking for each tracked person's animated 3-D skeleton."""

from __future__ import annotations

from sapiens2.pipelines.options import Option

MOTION = Option(
    "motion",
    "Motion capture (videos: every tracked person as an animated 3-D skeleton, BVH and glTF)",
    "checkbox",
    False,
    help="Runs the pointmap model on every frame too, lifts each tracked person's keypoints into 3-D and "
    "writes {video}_motion.glb (every person, animated) and {video}_motion_{id}.bvh per person.",
)
