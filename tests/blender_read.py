"""Run by Blender's Python (the `bpy` wheel): import motion files and print, as JSON, the head of every bone
of every armature at the frames asked, in the files' own axes (Y up; Blender's importers turn Y up into
its Z up, which is turned back here).

    python blender_read.py FPS FRAME,FRAME,... FILE...
"""

import json
import sys

import bpy


def _positions(frames: list[int], offset: int) -> dict:
    """{armature name: {bone name: {frame: [x, y, z]}}} for the armatures in the scene."""
    scene = bpy.context.scene
    out: dict = {}
    for obj in scene.objects:
        if obj.type != "ARMATURE":
            continue
        bones = out.setdefault(obj.name, {})
        for frame in frames:
            scene.frame_set(frame + offset)
            for bone in obj.pose.bones:
                x, y, z = obj.matrix_world @ bone.head
                bones.setdefault(bone.name, {})[str(frame)] = [x, z, -y]
    return out


def main() -> None:
    fps, frames, paths = float(sys.argv[1]), [int(f) for f in sys.argv[2].split(",")], sys.argv[3:]
    report = {}
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
    print("MOTION-JSON " + json.dumps(report))


if __name__ == "__main__":
    main()
