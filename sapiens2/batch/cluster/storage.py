"""Where photos and results live: local folders or any URI that pyarrow (else fsspec) opens."""

from __future__ import annotations

import os
import posixpath
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs

from sapiens2.batch.inputs import (
    Source,
    folder_files,
    is_input_name,
    not_a_file,
    output_places,
    printable,
)
from sapiens2.batch.plan import Plan, write_image_outputs
from sapiens2.batch.video import VIDEO_EXTENSIONS
from sapiens2.outputs.results import TaskResult
from sapiens2.tasks.registry import Task
from sapiens2.vision.files import open_regular


@dataclass(frozen=True)
class Place:
    """A folder or file: its filesystem, its path there, and the text the user wrote."""

    filesystem: pafs.FileSystem
    path: str
    text: str

    @property
    def is_local(self) -> bool:
        return isinstance(self.filesystem, pafs.LocalFileSystem)

    def join(self, *parts: str) -> str:
        return posixpath.join(self.path, *parts)

    def relative(self, path: str) -> str:
        """`path` relative to this place."""
        return posixpath.relpath(path, self.path)

    def shown(self, path: str) -> str:
        """`path` (under this place) as the user would write it."""
        relative = posixpath.relpath(path, self.path)
        return self.text if relative == "." else posixpath.join(self.text.rstrip("/"), relative)


def place(text: str) -> Place:
    """The place a path or URI names: file://, s3://, gs://, hdfs:// through pyarrow, other schemes
    through fsspec; a plain path is a local one, made absolute (workers may run elsewhere)."""
    if "://" not in text:
        return Place(pafs.LocalFileSystem(), os.path.abspath(os.path.expanduser(text)), text)
    try:
        filesystem, path = pafs.FileSystem.from_uri(text)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError):
        import fsspec

        fs, path = fsspec.core.url_to_fs(text)
        filesystem = pafs.PyFileSystem(pafs.FSSpecHandler(fs))
    return Place(filesystem, path.rstrip("/") or path, text)


@dataclass(frozen=True)
class Found:
    """One input file: where it is, its label in messages and tables, and its path under the folder named."""

    file: Place
    label: str
    relative: tuple[str, ...]

    @property
    def is_video(self) -> bool:
        return posixpath.splitext(self.file.path)[1].lower() in VIDEO_EXTENSIONS


def _is_file(info: pafs.FileInfo) -> bool:
    # Special files (a named pipe, a device) are listed as Unknown: refused below, as without --ray.
    return info.type in (pafs.FileType.File, pafs.FileType.Unknown)


def _problem(file: Place) -> str | None:
    """Why a local input cannot be read (a named pipe, a device, a broken link), as without --ray."""
    if not file.is_local:
        return None
    problem = not_a_file(Path(file.path))
    return "No such file or folder." if problem == "No such file." else problem


def _key(file: Place) -> tuple[str, str]:
    """What makes two inputs one file: a local file is one however it is reached (a link, `..`)."""
    path = os.path.realpath(file.path) if file.is_local else file.path
    return type(file.filesystem).__name__, path


def _folder_files(where: Place, out: Place) -> list[tuple[str, ...]]:
    """The photos and videos under a folder as their paths under it (parts): local folders are listed as
    without --ray (links to folders not followed), others (no links there) in one listing, sorted the same."""
    if where.is_local:
        return folder_files(Path(where.path), Path(os.path.realpath(out.path)) if out.is_local else None)
    skip = out.path.rstrip("/") + "/" if type(where.filesystem) is type(out.filesystem) else None
    found = []
    for entry in where.filesystem.get_file_info(pafs.FileSelector(where.path, recursive=True)):
        relative = tuple(posixpath.relpath(entry.path, where.path).split("/"))
        inside_out = skip is not None and entry.path.startswith(skip)
        if _is_file(entry) and is_input_name(relative) and not inside_out:
            found.append(relative)
    return sorted(found)


def find_inputs(texts: list[str], out: Place) -> tuple[list[Found], list[tuple[str, str]]]:
    """Image and video files named or found under the folders named (hidden entries and the output folder
    left out), each once; and the inputs that cannot be read, each with its sentence."""
    candidates: list[Found] = []
    missing = []
    for text in texts:
        where = place(text)
        info = where.filesystem.get_file_info(where.path)
        if info.type == pafs.FileType.Directory:
            for relative in _folder_files(where, out):
                path = where.join(*relative)
                file = Place(where.filesystem, path, where.shown(path))
                candidates.append(Found(file, printable(file.text), relative))
        elif _is_file(info) or where.is_local:
            candidates.append(Found(where, printable(text), (posixpath.basename(where.path),)))
        else:
            missing.append((printable(text), "No such file or folder."))
    found: dict[tuple[str, str], Found] = {}
    for item in candidates:
        problem = _problem(item.file)
        if problem is None:
            found.setdefault(_key(item.file), item)
        else:
            missing.append((item.label, problem))
    return list(found.values()), missing


def output_stems(found: list[Found], out: Place) -> list[tuple[str, str]]:
    """(output folder, stem) of each input, named as the command line without --ray names them."""
    places = output_places([(item.relative, item.file.path) for item in found])
    return [(out.join(*folders), stem) for folders, stem in places]


def existing_files(out: Place) -> set[str]:
    """Every file under the output folder, listed once (one listing is far cheaper than a check per file)."""
    selector = pafs.FileSelector(out.path, recursive=True, allow_not_found=True)
    return {info.path for info in out.filesystem.get_file_info(selector) if _is_file(info)}


def read_bytes(filesystem: pafs.FileSystem, path: str) -> bytes:
    """A file's bytes; local files are read as the command line reads them: a regular file only, checked
    once opened (a file the listing saw, swapped for a named pipe or a device since, never blocks or floods
    a worker)."""
    if isinstance(filesystem, pafs.LocalFileSystem):
        with open_regular(path) as file:
            return file.read()
    with filesystem.open_input_stream(path) as stream:
        return stream.read()


def write_outputs(
    result: TaskResult, task: Task, plan: Plan, out: Place, directory: str, stem: str
) -> tuple[list[str], int]:
    """Write a photo's planned files as the command line does; returns the files written and those kept.

    Local folders get the command line's own writer (each file atomic, in place); elsewhere the files
    are written to a local folder first and copied up one by one, each target a single whole object.
    """
    if out.is_local:
        written, kept = write_image_outputs(result, task, Source(Path(), "", Path(directory), stem), plan)
        return [str(path) for path in written], kept
    with tempfile.TemporaryDirectory(prefix="sapiens2-") as staging:
        staged, _ = write_image_outputs(result, task, Source(Path(), "", Path(staging), stem), plan)
        targets = [posixpath.join(directory, path.name) for path in staged]
        there = {info.path for info in out.filesystem.get_file_info(targets) if _is_file(info)}
        written, kept = [], 0
        for path, target in zip(staged, targets, strict=True):
            if target in there and not plan.overwrite:
                kept += 1
                continue
            with open(path, "rb") as source, out.filesystem.open_output_stream(target) as stream:
                shutil.copyfileobj(source, stream, 1 << 20)
            written.append(target)
        return written, kept
