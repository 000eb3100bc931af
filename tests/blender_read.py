"""Run by Blender's Python (the `bpy` wheel): import motion files and print, as JSON, the head of every bone
of every armature at the frames asked, in the files' own axes (Y up; Blender's importers turn Y up into
its Z up, which is turned back here). With --size, a file's camera, if it has one, also gives each head's
place in its picture of WIDTHxHEIGHT pixels, seen through Blender's own camera.

    python blender_read.py [--size WIDTHxHEIGHT] FPS FRAME,FRAME,... FILE...
"""

import json
import sys

import bpy
from bpy_extras.object_utils import world_to_camera_view


def _heads(frames: list[int], offset: int, place) -> dict:
    """{armature name: {bone name: {frame: place(head)}}} for the armatures in the scene, `head` the bone's
    head in Blender's world at the file's `frame` (Blender's frame + `offset`)."""
    scene = bpy.context.scene
    out: dict = {}
    for obj in scene.objects:
        if obj.type != "ARMATURE":
            continue
        bones = out.setdefault(obj.name, {})
        for frame in frames:
            scene.frame_set(frame + offset)
            for bone in obj.pose.bones:
                bones.setdefault(bone.name, {})[str(frame)] = place(obj.matrix_world @ bone.head)
    return out


def _positions(frames: list[int], offset: int) -> dict:
    """Each bone head in the file's axes (Blender's Z up turned back into Y up)."""
    return _heads(frames, offset, lambda head: [head.x, head.z, -head.y])


def _pixels(frames: list[int], size: tuple[int, int]) -> dict:
    """Each bone head's pixel (OpenCV's: the centre of the top-left pixel at 0, 0) in the picture of the
    scene's camera at `size`."""
    scene = bpy.context.scene
    scene.render.resolution_x, scene.render.resolution_y = size
    scene.render.resolution_percentage = 100
    camera = next(obj for obj in scene.objects if obj.type == "CAMERA")

    def pixel(head) -> list[float]:
        seen = world_to_camera_view(scene, camera, head)
        return [seen.x * size[0] - 0.5, (1 - seen.y) * size[1] - 0.5]

    return _heads(frames, 0, pixel)


def main() -> None:
    arguments = sys.argv[1:]
    size = None
    if arguments[0] == "--size":
        size = tuple(int(side) for side in arguments[1].split("x"))
        arguments = arguments[2:]
    fps, frames, paths = float(arguments[0]), [int(f) for f in arguments[1].split(",")], arguments[2:]
    report = {}
    pixels = {}
    for path in paths:
        bpy.ops.wm.read_factory_settings(use_empty=True)
        scene = bpy.context.scene
        scene.render.fps, scene.render.fps_base = round(fps), round(fps) / fps
        if path.endswith(".bvh"):
            # Blender frame 1 is the file's first frame; units as in the file (metres).
            bpy.ops.import_anim.bvh(filepath=path, global_scale=1.0, frame_start=1, use_fps_scale=False)
            report[path] = _positions(frames, 1)
        else:
            bpy.ops.import_scene.gltf(filepath=path)
            report[path] = _positions(frames, 0)
            if size and any(obj.type == "CAMERA" for obj in scene.objects):
                pixels[path] = _pixels(frames, size)
    print("MOTION-JSON " + json.dumps({"positions": report, "pixels": pixels}))


if __name__ == "__main__":
    main()
