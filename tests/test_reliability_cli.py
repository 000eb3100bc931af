"""The command line given inputs that are not regular files, names that are not UTF-8, and an --out that
cannot hold the results: each gets a sentence (up front when it can be known up front) and the run goes on
with the rest; inputs whose output names would clash each get their own files."""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import signal
import subprocess
import sys
import threading
import unicodedata
from pathlib import Path

import pytest
from test_cli import run_cli

from sapiens2.batch.inputs import output_places

ROOT = Path(__file__).resolve().parents[1]
PHOTO = ROOT / "assets" / "grace_hopper.jpg"


@pytest.fixture
def awkward_folder(tmp_path) -> Path:
    """A good photo beside a FIFO named like a photo, a loop of links, a link to nowhere and a device."""
    folder = tmp_path / "in"
    folder.mkdir()
    shutil.copy(PHOTO, folder / "good.jpg")
    os.mkfifo(folder / "pipe.jpg")
    os.symlink("loop_b.png", folder / "loop_a.png")
    os.symlink("loop_a.png", folder / "loop_b.png")
    os.symlink("/nonexistent/photo.jpg", folder / "dangling.jpg")
    os.symlink("/dev/zero", folder / "zero.mp4")
    return folder


def run_cli_process(
    *argv, environ: dict[str, str] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess:
    """`python -m sapiens2 ...` in its own process (a hang ends at the timeout, not the test run)."""
    command = [sys.executable, "-m", "sapiens2", *map(os.fsdecode, argv)]
    env = {**os.environ, **(environ or {})}
    return subprocess.run(command, cwd=ROOT, capture_output=True, timeout=timeout, env=env)


def test_fifos_devices_and_loops_of_links_are_reported_and_the_rest_runs(
    awkward_folder, small_mirror, tmp_path
):
    done = run_cli_process(
        "segment", awkward_folder, awkward_folder / "pipe.jpg", "--out", tmp_path / "out",
        "--checkpoint-dir", small_mirror, "--device", "cpu", "--exports", "npy", "--no-pictures",
    )  # fmt: skip
    printed = done.stdout.decode()
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert "Traceback" not in printed + done.stderr.decode()
    assert "pipe.jpg: It is a named pipe (FIFO), not an image or video file." in printed
    assert "loop_a.png: 'loop_a.png' is a loop of symbolic links that never reaches a file." in printed
    assert "zero.mp4: It is a character device, not an image or video file." in printed
    assert "dangling.jpg: It is a link to a file that does not exist." in printed
    assert (tmp_path / "out" / "good_segmentation.npy").is_file()


def test_a_file_name_that_is_not_utf8_on_a_strict_utf8_terminal(small_mirror, tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    shutil.copy(PHOTO, os.path.join(os.fsencode(folder), b"caf\xe9_\xff.jpg"))  # Latin-1 bytes: not UTF-8
    with open(os.path.join(os.fsencode(folder), b"d\xe9j\xe0_vu.jpg"), "wb") as broken:  # its name is printed
        broken.write(b"not a photo")
    done = run_cli_process(
        "segment", folder, "--out", tmp_path / "out", "--checkpoint-dir", small_mirror, "--device", "cpu",
        "--exports", "npy", "--no-pictures",
        environ={"PYTHONIOENCODING": "utf-8:strict", "LC_ALL": "C.UTF-8"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert "Traceback" not in done.stderr.decode()
    printed = done.stdout.decode()
    assert "1 file written" in printed and "d\\xe9j\\xe0_vu.jpg: The file is not an image" in printed


@pytest.mark.parametrize("case", ["a file", "a name too long", "under a file"])
def test_an_out_that_cannot_hold_results_is_a_usage_error_before_any_model_runs(tmp_path, case):
    blocker = tmp_path / "results.txt"
    blocker.write_text("not a folder")
    out = {"a file": blocker, "a name too long": tmp_path / ("x" * 300), "under a file": blocker / "sub"}[
        case
    ]
    errors = io.StringIO()
    with contextlib.redirect_stderr(errors), pytest.raises(SystemExit) as stopped:
        run_cli("segment", PHOTO, "--out", out, "--checkpoint-dir", tmp_path)  # no model there: never loaded
    assert stopped.value.code == 2
    message = errors.getvalue().strip().splitlines()[-1]
    expected = {
        "a file": "is a file, not a folder",
        "a name too long": "the folder name is too long",
        "under a file": "the folder cannot be written",
    }[case]
    assert expected in message and "Traceback" not in errors.getvalue()


def test_outputs_whose_names_would_be_too_long_are_refused_up_front(small_mirror, tmp_path):
    out = tmp_path / "out"
    while len(os.fsencode(out)) < 3950:  # an output folder the system can name, with little room left
        out = out / ("o" * min(200, 3960 - len(os.fsencode(out))))
    (tmp_path / "in" / ("d" * 250)).mkdir(parents=True)
    shutil.copy(PHOTO, tmp_path / "in" / ("d" * 250) / "deep.jpg")  # its outputs would pass 4095 bytes
    shutil.copy(PHOTO, tmp_path / "in" / "near.jpg")
    status, printed = run_cli(
        "segment", tmp_path / "in", "--out", out, "--checkpoint-dir", small_mirror,
        "--device", "cpu", "--exports", "npy", "--no-pictures",
    )  # fmt: skip
    assert status == 0
    assert "deep.jpg: Its output file names would be too long for this system." in printed
    assert (out / "near_segmentation.npy").is_file()


def colliding_inputs(root: Path) -> list[Path]:
    """Two folders that both hold a.jpg, and a folder of names that sanitize to one name or differ only in
    case or in how é is written (composed, NFC, or as e and a combining accent, NFD)."""
    for name in ("x", "y", "z"):
        (root / name).mkdir(parents=True)
    for path in [
        root / "x" / "a.jpg",
        root / "y" / "a.jpg",
        root / "z" / "a b.jpg",
        root / "z" / "a_b.jpg",
        root / "z" / unicodedata.normalize("NFC", "café.jpg"),
        root / "z" / unicodedata.normalize("NFD", "café.jpg"),
        root / "z" / "Photo.jpg",
        root / "z" / "photo.jpg",
    ]:
        shutil.copy(PHOTO, path)
    return [root / "x", root / "y", root / "z"]


def test_inputs_whose_output_names_collide_each_get_their_own_files(small_mirror, tmp_path):
    inputs = colliding_inputs(tmp_path / "in")
    out = tmp_path / "out"
    args = ["--out", out, "--checkpoint-dir", small_mirror, "--device", "cpu", "--exports", "npy"]
    args.append("--no-pictures")
    status, printed = run_cli("segment", *inputs, *args)
    assert status == 0
    assert "8 files written" in printed and "kept" not in printed, printed
    written = sorted(path.name for path in out.iterdir())
    assert len({name.casefold() for name in written}) == 8, written  # distinct on a case-insensitive disk too
    assert "a_segmentation.npy" not in written  # neither a.jpg takes the plain name from the other
    # A rerun finds every photo's files under the same names (resume works), whatever the inputs' order.
    status, printed = run_cli("segment", *reversed(inputs), *args)
    assert status == 0 and "0 files written" in printed and "8 already there (kept)" in printed
    assert sorted(path.name for path in out.iterdir()) == written


def test_output_names_are_kept_unless_they_clash_and_then_depend_on_the_input_alone():
    places = output_places(
        [
            (("people", "ann.jpg"), "/in/people/ann.jpg"),
            (("photo.jpg",), "/in/photo.jpg"),
            (("photo.png",), "/in/photo.png"),
            (("a.jpg",), "/x/a.jpg"),
            (("a.jpg",), "/y/a.jpg"),
        ]
    )
    assert places[:3] == [(("people",), "ann"), ((), "photo.jpg"), ((), "photo.png")]
    assert places[3] != places[4] and all(stem.startswith("a-") for _, stem in places[3:])
    alone_with_a_third = output_places([(("a.jpg",), "/y/a.jpg"), (("a.jpg",), "/w/a.jpg")])
    assert alone_with_a_third[0] == places[4]  # its name comes from its own path, not from its neighbours


# ---- sapiens2 train on folders holding pipes and devices, and stopped while it loads ---------------------


@pytest.fixture(scope="module")
def training_workspace(tmp_path_factory) -> Path:
    """A tiny segmentation and pose dataset and a tiny checkpoint of each task."""
    from test_training import trainable_checkpoint
    from tiny_datasets import WRITERS

    root = tmp_path_factory.mktemp("train")
    for task in ("segment", "pose"):
        WRITERS[task](root / f"{task}_data", count=2)
        trainable_checkpoint(root / f"{task}_model", task)
    return root


def train_arguments(workspace: Path, task: str, data: Path, out: Path) -> list:
    return [
        "train", task, "--data", data, "--model", workspace / f"{task}_model", "--out", out, "--steps", "2",
        "--batch-size", "2", "--input-size", "64x48", "--new-labels", "--workers", "0", "--no-progress",
    ]  # fmt: skip


@pytest.mark.parametrize(
    "task, special, expected",
    [
        ("segment", "images/photo_1.png", "'photo_1.png' is a named pipe (FIFO), not a regular file."),
        ("segment", "masks/photo_0.png", "'photo_0.png' is a named pipe (FIFO), not a regular file."),
        ("segment", "classes.json", "'classes.json' is a named pipe (FIFO), not a regular file."),
        ("pose", "images/person_0.png", "'person_0.png' is a named pipe (FIFO), not a regular file."),
        (
            "segment",
            "images/photo_0.png->/dev/zero",
            "'photo_0.png' is a character device, not a regular file.",
        ),
    ],
)
def test_train_refuses_pipes_and_devices_in_its_data_at_once(
    training_workspace, tmp_path, task, special, expected
):
    # A FIFO among the photos blocked `sapiens2 train` in open() for good (still there after 21 minutes).
    data = tmp_path / "data"
    shutil.copytree(training_workspace / f"{task}_data", data)
    name, _, target = special.partition("->")
    place = data / name
    place.unlink()
    os.symlink(target, place) if target else os.mkfifo(place)
    done = run_cli_process(*train_arguments(training_workspace, task, data, tmp_path / "out"), timeout=120)
    printed = done.stderr.decode()
    assert done.returncode == 1, printed[-2000:]
    assert expected in printed and "Traceback" not in printed


# Reads that never return (a file on a hung network mount) stand in as a read that waits for ever once the
# run reaches it; the test then sends the signal.
HANGING_READ = """
import sys, time
from sapiens2.training import cli, datasets
def hanging(path):
    print("reading", flush=True)
    time.sleep(3600)
datasets.read_file = hanging
sys.exit(cli.main(sys.argv[1:]))
"""


@pytest.mark.parametrize("task", ["pose", "segment"])  # pose reads photo sizes up front, segment per batch
@pytest.mark.parametrize("number", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_while_train_loads_ends_it_at_once(training_workspace, tmp_path, task, number):
    arguments = train_arguments(
        training_workspace, task, training_workspace / f"{task}_data", tmp_path / "out"
    )
    command = [
        sys.executable,
        "-c",
        HANGING_READ,
        *map(os.fsdecode, arguments[1:]),
    ]  # cli.main takes no "train"
    with subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as process:
        try:
            assert process.stdout.readline() == b"reading\n", process.stderr.read().decode()[-2000:]
            process.send_signal(number)
            status = process.wait(timeout=60)
        finally:
            process.kill()
        printed = process.stderr.read().decode()
    assert status == 1, printed[-2000:]
    assert f"sapiens2 train: stopped by {signal.Signals(number).name} while loading" in printed
    assert "Traceback" not in printed


def test_ray_reads_a_file_swapped_for_a_pipe_or_a_device_as_the_command_line_does(tmp_path):
    # Before: --ray's workers opened a listed file with a plain open(): one swapped for a FIFO since the
    # listing blocked its worker for good, one linked to /dev/zero read without end.
    pafs = pytest.importorskip("pyarrow.fs")
    from sapiens2.batch.cluster.storage import read_bytes
    from sapiens2.vision.files import NotRegularFileError

    fifo, zero = tmp_path / "photo.jpg", tmp_path / "zero.jpg"
    os.mkfifo(fifo)
    os.symlink("/dev/zero", zero)
    outcomes: dict[str, BaseException | bytes] = {}

    def read(path: Path) -> None:
        try:
            outcomes[path.name] = read_bytes(pafs.LocalFileSystem(), str(path))
        except BaseException as error:
            outcomes[path.name] = error

    readers = [threading.Thread(target=read, args=(path,), daemon=True) for path in (fifo, zero)]
    for reader in readers:
        reader.start()
    for reader in readers:
        reader.join(timeout=60)
    if readers[0].is_alive():  # the old read, blocked in open(): a writer that closes at once ends it
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    assert isinstance(outcomes.get("photo.jpg"), NotRegularFileError), outcomes
    assert isinstance(outcomes.get("zero.jpg"), NotRegularFileError), outcomes
