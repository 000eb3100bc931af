"""The inputs of a batch run: files named and files found under folders, each with its output place."""

from __future__ import annotations

import hashlib
import os
import stat
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePath

from sapiens2.batch.video import VIDEO_EXTENSIONS
from sapiens2.vision.files import file_kind, file_problem
from sapiens2.vision.images import sanitize_filename

IMAGE_EXTENSIONS = frozenset({".jpg", ".jpeg", ".png", ".webp", ".bmp", ".gif", ".tif", ".tiff"})


@dataclass(frozen=True)
class Source:
    """One input file and the folder and stem its outputs are named after."""

    path: Path
    label: str
    directory: Path
    stem: str

    @property
    def is_video(self) -> bool:
        return self.path.suffix.lower() in VIDEO_EXTENSIONS


def is_input_name(relative: Sequence[str]) -> bool:
    """True for a photo or video name (by extension) under no hidden folder and not hidden itself."""
    return not any(part.startswith(".") for part in relative) and (
        PurePath(relative[-1]).suffix.lower() in IMAGE_EXTENSIONS | VIDEO_EXTENSIONS
    )


def folder_files(folder: Path, skip: Path | None) -> list[tuple[str, ...]]:
    """The image and video files under a local `folder`, as their paths under it (parts), sorted; hidden
    entries, the `skip` folder and links to folders are left out (a link to `.` or to a parent would list
    the same files again, or for ever). With and without --ray, local folders are listed here."""
    found = []
    for root, folders, files in os.walk(folder):  # os.walk does not descend into links to folders
        folders[:] = [
            name for name in folders if not name.startswith(".") and _real(Path(root) / name) != skip
        ]
        under = Path(root).relative_to(folder).parts
        found += [(*under, name) for name in files if is_input_name((*under, name))]
    return sorted(found)


def _real(path: Path) -> Path:
    """The path with every link followed as far as it goes; never raises, even on a loop of links."""
    return Path(os.path.realpath(path))


def printable(text: str) -> str:
    """`text` as any terminal can print it: bytes of a file name that are not UTF-8 shown as \\xNN."""
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def not_a_file(path: Path) -> str | None:
    """Why `path` cannot be read as an input file (a sentence), or None when it is a regular file."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return "It is a link to a file that does not exist." if os.path.lexists(path) else "No such file."
    except OSError as error:
        return file_problem(error, printable(path.name), "an image or video file")
    if stat.S_ISREG(mode):
        return None
    return f"It is {file_kind(mode)}, not an image or video file."


def collect_sources(inputs: Sequence[str], out: Path) -> tuple[list[Source], list[tuple[str, str]]]:
    """The files named or found under the folders named, with their output places; and the inputs that
    cannot be read (missing, a FIFO or device, a loop of links), each with its sentence."""
    found: list[tuple[Path, str, tuple[str, ...]]] = []  # (file, label, its path under the folder named)
    missing = []
    for text in inputs:
        path = Path(text).expanduser()
        if path.is_dir():
            walked = [
                (path.joinpath(*parts), printable(str(path.joinpath(*parts))), parts)
                for parts in folder_files(path, _real(out))
            ]
        else:
            walked = [(path, printable(text), (path.name,))]
        for file, label, relative in walked:
            problem = not_a_file(file)
            if problem is None:
                found.append((file, label, relative))
            else:
                missing.append((label, "No such file or folder." if problem == "No such file." else problem))
    unique = {_real(file): (file, label, relative) for file, label, relative in reversed(found)}
    found = list(reversed(unique.values()))  # a file named twice (alone and in its folder) runs once
    places = output_places([(relative, os.path.abspath(file)) for file, _, relative in found])
    return [
        Source(file, label, out.joinpath(*folders), stem)
        for (file, label, _), (folders, stem) in zip(found, places, strict=True)
    ], missing


def output_places(inputs: Sequence[tuple[Sequence[str], str]]) -> list[tuple[tuple[str, ...], str]]:
    """For each input, given as its path under the folder named (parts) and its full path: the output
    subfolders and the stem its outputs are named after, made safe and unique.

    Inputs that differ only by extension (photo.jpg, photo.png) keep it in their stem. Names that would
    still be one file (x/a.jpg and y/a.jpg, "a b.jpg" and a_b.jpg, é composed or not, or names that differ
    only in case, one file on a case-insensitive disk) get a hash of their full path, the same on every run.
    """
    folders = [tuple(sanitize_filename(part, "folder") for part in parts[:-1]) for parts, _ in inputs]
    stems = [sanitize_filename(PurePath(parts[-1]).stem) for parts, _ in inputs]
    bare = list(stems)
    for index in _clashing(folders, stems):
        stems[index] = sanitize_filename(inputs[index][0][-1])
    for length in (8, 16, 64):  # a longer hash for the (very unlikely) names that a short one leaves clashing
        for index in _clashing(folders, stems):
            digest = hashlib.sha256(os.fsencode(inputs[index][1])).hexdigest()
            stems[index] = f"{bare[index]}-{digest[:length]}"
    return list(zip(folders, stems, strict=True))


def _clashing(folders: Sequence[tuple[str, ...]], stems: Sequence[str]) -> list[int]:
    """The indices of the outputs that would land on another's files (compared as a case-insensitive
    filesystem compares names)."""
    keys = ["/".join((*parts, stem)).casefold() for parts, stem in zip(folders, stems, strict=True)]
    uses = Counter(keys)
    return [index for index, key in enumerate(keys) if uses[key] > 1]
