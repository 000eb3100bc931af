"""A stop signal while an answer is being written: the app and the command line leave nothing partial
behind (no temporary file, no multiprocessing folder, no scratch root), whatever the writer was doing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from gradio_client import Client, handle_file
from held_writes import HELD
from PIL import Image
from test_reliability_attacks import app_process

ROOT = Path(__file__).resolve().parents[1]
LAUNCHER = str(Path(__file__).with_name("held_writes.py"))


def large_photo(folder: Path) -> Path:
    """A 12-megapixel photo (4000x3000) of smooth noise."""
    rng = np.random.default_rng(0)
    small = rng.integers(0, 256, (30, 40, 3), dtype=np.uint8)
    path = folder / "large.png"
    Image.fromarray(small).resize((4000, 3000), Image.BILINEAR).save(path)
    return path


def held_path(lines) -> str:
    """The temporary's path from the launcher's line, read from a process's output (bounded by its end)."""
    for line in lines:
        if HELD in line:  # after a progress bar's last \r, perhaps
            return line.split(HELD)[1].strip()
    raise AssertionError("the process ended before it wrote anything")


def leftovers(*folders: Path) -> list[str]:
    """Partial files, multiprocessing folders and scratch roots under `folders`."""
    found = []
    for folder in folders:
        for parent, names, files in os.walk(folder):
            for name in [*names, *files]:
                if name.endswith((".tmp", ".partial")) or name.startswith(("pymp-", "sapiens2-")):
                    found.append(os.path.join(parent, name))
    return found


@pytest.mark.parametrize("number", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_while_the_app_writes_an_answer_leaves_nothing_partial(small_mirror, tmp_path, number):
    photo = large_photo(tmp_path)
    with app_process(small_mirror, tmp_path, [LAUNCHER]) as (process, url, temporary):
        request = threading.Thread(
            target=lambda: Client(url, verbose=False).submit(handle_file(str(photo)), api_name="/depth"),
            daemon=True,
        )
        request.start()
        partial = held_path(process.stdout)
        assert Path(partial).exists() and Path(partial).is_relative_to(temporary)
        process.send_signal(number)
        output = process.communicate(timeout=120)[0]
    assert process.returncode == 0, output[-2000:]
    assert "Traceback" not in output and "terminate called" not in output
    assert not leftovers(temporary), leftovers(temporary)
    assert not list(temporary.iterdir())


@pytest.mark.parametrize("number", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_while_the_command_line_writes_leaves_nothing_partial(small_mirror, tmp_path, number):
    photos, out, temporary = tmp_path / "in", tmp_path / "out", tmp_path / "tmp"
    for folder in (photos, temporary):
        folder.mkdir()
    large_photo(photos)
    environ = {
        **os.environ,
        "TMPDIR": str(temporary),
        "SAPIENS2_CHECKPOINT_DIR": str(small_mirror),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    command = [sys.executable, LAUNCHER, "-m", "sapiens2", "depth", str(photos), "--out", str(out)]
    command += ["--device", "cpu"]
    with subprocess.Popen(
        command, cwd=ROOT, env=environ, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    ) as process:
        try:
            partial = held_path(process.stdout)
            assert Path(partial).exists() and Path(partial).is_relative_to(out)
            process.send_signal(number)
            output = process.communicate(timeout=120)[0]
        finally:
            process.kill()
    assert process.returncode in (-number, 128 + number), output[-2000:]
    assert "Traceback" not in output
    assert not leftovers(out, temporary), leftovers(out, temporary)
