"""The inputs of a batch run: files named and files found under folders, each with its output place."""

from __future__ import annotations

import os
import stat
from collections import Counter
from collections.abc import Iterator, Sequence
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


def _walk(folder: Path, skip: Path) -> Iterator[Path]:
    """Image and video files under `folder`, sorted, leaving out hidden entries and the `skip` folder."""
    for root, folders, files in os.walk(folder):
        folders[:] = sorted(
            name for name in folders if not name.startswith(".") and _real(Path(root) / name) != skip
        )
        for name in sorted(files):
            if not name.startswith(".") and Path(name).suffix.lower() in IMAGE_EXTENSIONS | VIDEO_EXTENSIONS:
                yield Path(root) / name


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
    found: list[tuple[Path, str, Path]] = []  # (file, label, its path under the output folder)
    missing = []
    for text in inputs:
        path = Path(text).expanduser()
        if path.is_dir():
            walked = [
                (file, printable(str(file)), file.relative_to(path)) for file in _walk(path, _real(out))
            ]
        else:
            walked = [(path, printable(text), Path(path.name))]
        for file, label, relative in walked:
            problem = not_a_file(file)
            if problem is None:
                found.append((file, label, relative))
            else:
                missing.append((label, "No such file or folder." if problem == "No such file." else problem))
    unique = {_real(file): (file, label, relative) for file, label, relative in reversed(found)}
    found = list(reversed(unique.values()))  # a file named twice (alone and in its folder) runs once
    places = output_places([relative.parts for _, _, relative in found])
    return [
        Source(file, label, out.joinpath(*folders), stem)
        for (file, label, _), (folders, stem) in zip(found, places, strict=True)
    ], missing


def output_places(relatives: Sequence[Sequence[str]]) -> list[tuple[tuple[str, ...], str]]:
    """For each input's path under its folder (as parts): the output subfolders and the stem its outputs are
    named after, both made safe; inputs that differ only by extension keep it in their stem."""
    places = []
    for parts in relatives:
        folders = tuple(sanitize_filename(part, "folder") for part in parts[:-1])
        places.append((folders, sanitize_filename(PurePath(parts[-1]).stem), parts[-1]))
    uses = Counter((folders, stem) for folders, stem, _ in places)
    # Inputs that differ only by extension (photo.jpg, photo.png) keep it in their stem, so both are kept.
    return [
        (folders, stem if uses[folders, stem] == 1 else sanitize_filename(name))
        for folders, stem, name in places
    ]
