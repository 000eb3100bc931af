"""`--ray` on a local Ray cluster of 2 CPUs (one session for the module): the same files as the command line
without it, tables of predictions and failures, resumed runs, a killed model actor; and the stage sizing."""

import contextlib
import io
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from test_cli import ASSETS, expected_files, files_under, run_cli

from sapiens2.cli import EXIT_OK, main

pytest.importorskip("ray.data", reason="the scale extra (requirements-scale.txt) is not installed")
pq = pytest.importorskip("pyarrow.parquet")

import ray  # noqa: E402

from sapiens2.batch.cluster.run import SizingError, size_stages  # noqa: E402
from sapiens2.batch.cluster.storage import find_inputs, output_stems, place  # noqa: E402
from sapiens2.batch.inputs import collect_sources  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
GOOD = {
    "grace_hopper.jpg": "grace_hopper",
    "people/astronaut.png": "people/astronaut",
    "people/deep/small.png": "people/deep/small",
}
BROKEN = {
    "broken.jpg": "The image file is incomplete",
    "people/fake.png": "not an image in a supported format",
}


@pytest.fixture(scope="module")
def ray_session():
    """One local Ray cluster of 2 CPUs for the module (starting one takes seconds)."""
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def make_photos(folder: Path) -> Path:
    """Nested photos, a truncated JPEG, a text file named .png, a hidden photo and a text file."""
    from PIL import Image

    (folder / "people/deep").mkdir(parents=True)
    shutil.copy(ASSETS / "grace_hopper.jpg", folder / "grace_hopper.jpg")
    shutil.copy(ASSETS / "astronaut.png", folder / "people/astronaut.png")
    Image.open(ASSETS / "grace_hopper.jpg").resize((96, 128)).save(folder / "people/deep/small.png")
    (folder / "broken.jpg").write_bytes((ASSETS / "grace_hopper.jpg").read_bytes()[:4000])
    (folder / "people/fake.png").write_text("not a photo")
    shutil.copy(ASSETS / "astronaut.png", folder / ".hidden.png")
    (folder / "notes.txt").write_text("not a photo")
    return folder


@pytest.fixture(scope="module")
def photos(tmp_path_factory) -> Path:
    return make_photos(tmp_path_factory.mktemp("photos"))


@pytest.fixture(scope="module")
def setup_args(small_mirror, few_persons_yolo) -> list[str]:
    return [
        "--checkpoint-dir",
        small_mirror,
        "--detector",
        few_persons_yolo,
        "--device",
        "cpu",
        "--batch-size",
        1,
    ]


def outputs(folder: Path) -> set[str]:
    """The per-photo files under an output folder (not the tables)."""
    return {name for name in files_under(folder) if not name.startswith(("predictions/", "failures/"))}


def table(folder: Path):
    return pq.read_table(folder).to_pandas() if folder.is_dir() else None


@pytest.mark.parametrize("task", ["segment", "pose"])
def test_the_same_files_as_without_ray_then_a_rerun_skips_everything(
    task, ray_session, photos, setup_args, tmp_path
):
    plain, scaled = tmp_path / "plain", tmp_path / "ray"
    # Float sums depend on how many threads share them: the plain run uses as many as a model actor does.
    threads = torch.get_num_threads()
    torch.set_num_threads(len(os.sched_getaffinity(0)))
    try:
        assert run_cli(task, photos, "--out", plain, *setup_args)[0] == EXIT_OK
    finally:
        torch.set_num_threads(threads)
    status, printed = run_cli(task, photos, "--out", scaled, "--ray", *setup_args)
    assert status == EXIT_OK, printed
    names = outputs(plain)
    assert names == outputs(scaled) and len(names) >= 2 * len(GOOD)
    for name in names:
        assert (plain / name).read_bytes() == (scaled / name).read_bytes(), name

    rows = table(scaled / "predictions" / task)
    assert sorted(rows["stem"]) == sorted(GOOD.values())
    assert sorted(rows["path"]) == sorted(str(photos / name) for name in GOOD)
    first = rows.set_index("stem").loc["grace_hopper"]
    assert (first["width"], first["height"]) == (512, 600)
    assert sorted(first["outputs"]) == sorted(str(scaled / name) for name in names if "grace" in name)
    assert set(first["seconds"]) >= {"read", "decode", "finish", "write"} and len(first["nodes"]) >= 1
    if task == "pose":
        assert first["persons"] == len(first["boxes"]) == len(first["keypoints"]) >= 1
        assert np.stack(first["keypoints"][0]).shape == (308, 2) and len(first["keypoint_scores"][0]) == 308
        assert f"{rows['persons'].sum()} persons found" in printed
    else:
        assert len(first["class_pixels"]) == 29 and sum(first["class_pixels"]) == 512 * 600
    failures = table(scaled / "failures")
    assert sorted(failures["path"]) == sorted(str(photos / name) for name in BROKEN)
    for name, why in BROKEN.items():
        assert why in failures.set_index("path").loc[str(photos / name), "reason"]
        assert f"{photos / name}: " in printed
    assert "hidden" not in printed and "notes.txt" not in printed and "seconds per photo: read" in printed

    stamps = {path: path.stat().st_mtime_ns for path in scaled.rglob("*") if path.is_file()}
    status, printed = run_cli(task, photos, "--out", scaled, "--ray", *setup_args)
    assert status == EXIT_OK and "0 files written" in printed
    assert f"{len(GOOD)} already done (skipped)" in printed
    assert "2 failures" in printed  # broken files have no outputs: tried again, reported again
    assert all(path.stat().st_mtime_ns == stamps[path] for path in stamps if path.suffix != ".parquet")
    assert len(table(scaled / "predictions" / task)) == len(GOOD)
    assert len(table(scaled / "failures")) == len(BROKEN)


def test_overwrite_redoes_every_photo_and_a_file_uri_works(ray_session, photos, setup_args, tmp_path):
    out = tmp_path / "out"
    args = ["segment", photos / "people", "--out", f"file://{out}", "--ray", "--exports", "npy"]
    assert run_cli(*args, "--no-pictures", *setup_args)[0] == EXIT_OK
    assert outputs(out) == {"astronaut_segmentation.npy", "deep/small_segmentation.npy"}
    status, printed = run_cli(*args, "--no-pictures", "--overwrite", *setup_args)
    assert status == EXIT_OK and "2 files written" in printed
    assert len(table(out / "predictions/segment")) == 2  # the rows of the first run were replaced


def test_a_broken_photo_in_a_block_of_good_ones_fails_alone(ray_session, small_mirror, tmp_path):
    folder = tmp_path / "photos"
    folder.mkdir()
    shutil.copy(ASSETS / "grace_hopper.jpg", folder / "a.jpg")
    (folder / "b.jpg").write_bytes((ASSETS / "grace_hopper.jpg").read_bytes()[:4000])
    shutil.copy(ASSETS / "astronaut.png", folder / "c.png")
    out = tmp_path / "out"
    status, printed = run_cli(
        "segment", folder, "--out", out, "--ray", "--checkpoint-dir", small_mirror, "--device", "cpu",
        "--batch-size", 8, "--exports", "npy", "--no-pictures",
    )  # fmt: skip
    assert status == EXIT_OK, printed  # one block of three rows: the good photos' rows beside a failed one
    assert "2 files written" in printed and "segment: 2 photos" in printed and "1 failure:" in printed
    assert f"and {out}/failures/ (one row per failure)." in printed  # pointed at, as it was written
    assert sorted(table(out / "predictions/segment")["stem"]) == ["a", "c"]
    (failed,) = table(out / "failures").to_dict("records")
    assert (failed["path"], failed["task"], failed["stage"]) == (str(folder / "b.jpg"), "segment", "decode")
    assert "The image file is incomplete" in failed["reason"]


def test_a_ray_run_prints_its_summary_and_no_logs_or_warnings_of_its_own(small_mirror, tmp_path):
    """The command as a user runs it (its own Ray, its own process, --out written with a slash at the end):
    no deprecation warning from the package, no lines of Ray Data's progress or pickling fallbacks, the
    tables' folders written as the user wrote --out, and Ray's usage statistics off."""
    folder = tmp_path / "photos"
    folder.mkdir()
    shutil.copy(ASSETS / "grace_hopper.jpg", folder / "a.jpg")
    out = tmp_path / "results_ray"
    argv = [
        "segment", str(folder), "--out", f"{out}/", "--ray", "--checkpoint-dir", str(small_mirror),
        "--device", "cpu", "--exports", "npy", "--no-pictures",
    ]  # fmt: skip
    script = (
        "import sys\n"
        "from ray._common.usage import usage_lib\n"
        "from sapiens2.cli import main\n"
        f"status = main({argv!r})\n"
        "print('usage stats enabled:', usage_lib.usage_stats_enabled())\n"
        "sys.exit(status)\n"
    )
    environ = {name: value for name, value in os.environ.items() if not name.startswith("RAY_")}
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=600, env=environ
    )
    printed = done.stdout + done.stderr
    assert done.returncode == EXIT_OK, printed[-3000:]
    assert f"Tables (Parquet): {out}/predictions/<task>/ (one row per photo)." in printed
    assert "failures/" not in printed and not (out / "failures").exists(), "no pointer to a table not written"
    assert "//" not in re.sub(r"\w+://", "", printed), printed
    assert not re.search(r"sapiens2/\S+\.py:\d+: \w*Warning", printed), printed
    assert "ArrowConversionError" not in printed and "logging_progress" not in printed, printed
    assert "usage stats enabled: False" in printed


def test_folders_are_listed_and_named_as_without_ray(tmp_path):
    """Links to folders are not followed (`loop -> .` would list every photo again, 40 levels deep), the
    order is the same, and clashing names get the same unique names."""
    folder = tmp_path / "in"
    (folder / "sub").mkdir(parents=True)
    (folder / "out").mkdir()
    for name in ("a.jpg", "sub/a.jpg", "sub/b c.png", "sub/b_c.png", "out/old.jpg", "z.png"):
        shutil.copy(ASSETS / "astronaut.png", folder / name)
    os.symlink(".", folder / "loop")
    os.symlink("sub", folder / "again")
    out = folder / "out"
    sources, missing = collect_sources([str(folder)], out)
    found, missing_with_ray = find_inputs([str(folder)], place(str(out)))
    assert not missing and not missing_with_ray
    assert [item.label for item in found] == [source.label for source in sources]
    listed = [source.path.relative_to(folder).as_posix() for source in sources]
    assert listed == ["a.jpg", "sub/a.jpg", "sub/b c.png", "sub/b_c.png", "z.png"]
    named = [(str(source.directory), source.stem) for source in sources]
    assert output_stems(found, place(str(out))) == named and len(set(named)) == 5


def _model_actor_pids() -> list[int]:
    """Processes of Ray model actors (Ray titles each worker process after what it runs)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if b"ModelStage" in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
    return found


def test_a_killed_model_actor_loses_no_photo(ray_session, setup_args, tmp_path):
    """The model actor is frozen (SIGSTOP) as soon as a first photo has its files, so that it finishes
    nothing more, then killed: the photos it held or would have taken go to its replacement, and every photo
    gets its files and its row."""
    folder = tmp_path / "photos"
    folder.mkdir()
    stems = [f"p{index:02d}" for index in range(16)]
    for stem in stems:
        shutil.copy(ASSETS / "grace_hopper.jpg", folder / f"{stem}.jpg")
    out = tmp_path / "out"
    printed = io.StringIO()

    def command() -> None:
        with contextlib.redirect_stdout(printed):
            main([str(arg) for arg in ["segment", folder, "--out", out, "--ray", *setup_args]])

    running = threading.Thread(target=command, daemon=True)
    running.start()
    done: list[Path] = []
    while not done and running.is_alive():  # the first photo through the model; no time limit here
        done = list(out.glob("*_segmentation.npy")) if out.is_dir() else []
        running.join(0.005)
    pids = _model_actor_pids()
    assert len(pids) == 1
    os.kill(pids[0], signal.SIGSTOP)
    finished = len(list(out.glob("*_segmentation.npy")))
    assert 1 <= finished < len(stems)  # mid-run: the frozen actor holds the rest of the work
    os.kill(pids[0], signal.SIGKILL)
    running.join()
    expected = {name for stem in stems for name in expected_files("segment", stem)}
    assert outputs(out) == expected
    assert sorted(table(out / "predictions/segment")["stem"]) == stems
    summary = printed.getvalue()
    assert (
        f"segment: {len(stems)} photos" in summary
        and "failure:" not in summary
        and "failures:" not in summary
    )
    assert _model_actor_pids() != pids


@pytest.mark.parametrize("cpus", [1, 2, 3, 8, 96])
@pytest.mark.parametrize("stages", [["read", "decode", "finish"], ["read", "decode", "crop", "finish"]])
def test_reservations_always_leave_room_for_every_stage(cpus, stages):
    model_stages = 1 + ("crop" in stages)
    for gpus in (0, 1, 8):
        for actors in (None, (1, 1), (1, 4)):
            sizing = size_stages({"CPU": cpus, "GPU": gpus}, 1, stages, model_stages, actors)
            low, high = sizing.actors
            actors_total = high * model_stages * sizing.actor_cpus
            # One task of each CPU stage runs beside the largest actor pools: nothing waits forever.
            assert actors_total + sum(sizing.task_cpus.values()) <= cpus + 1e-9
            assert all(0 < share <= 1 for share in sizing.task_cpus.values())
            assert sizing.actor_gpus == (1 / model_stages if gpus else 0)


def test_reservations_refuse_actors_the_cluster_cannot_hold():
    sizing = size_stages({"CPU": 2, "GPU": 1}, 1, ["read", "decode", "crop", "finish"], 2)
    assert sizing.actor_gpus == 0.5 and sizing.actors == (1, 1)  # the detector and pose share the GPU
    assert size_stages({"CPU": 2, "slot": 2}, 2, ["read", "finish"], 1, (2, 2), {"slot": 1}).actor_resources
    with pytest.raises(SizingError, match="need 4 GPU; the cluster has 2"):
        size_stages({"CPU": 64, "GPU": 2}, 2, ["read", "finish"], 1, (4, 8))
    with pytest.raises(SizingError, match="need 2 slot; the cluster has 1"):
        size_stages({"CPU": 2, "slot": 1}, 1, ["read", "finish"], 1, (2, 2), {"slot": 1})


def test_a_missing_ray_says_how_to_install_it(monkeypatch, capsys, tmp_path):
    # Ray is installed here: hiding it from imports is the only way to see what a user without it sees.
    monkeypatch.setitem(sys.modules, "ray", None)
    monkeypatch.setitem(sys.modules, "ray.data", None)
    with pytest.raises(SystemExit) as stopped:
        main(["segment", str(tmp_path), "--out", str(tmp_path / "out"), "--ray"])
    error = capsys.readouterr().err
    assert stopped.value.code == 2 and "pip install -r requirements-scale.txt" in error


def test_the_app_and_the_plain_command_line_never_import_ray(small_mirror, tmp_path):
    script = (
        "import sys, app\n"
        "from sapiens2.cli import main\n"
        f"status = main(['segment', {str(ASSETS / 'grace_hopper.jpg')!r}, '--out', {str(tmp_path)!r}, "
        f"'--checkpoint-dir', {str(small_mirror)!r}, '--device', 'cpu'])\n"
        "assert status == 0, status\n"
        "loaded = sorted(name for name in sys.modules if name == 'ray' or name.startswith('ray.'))\n"
        "assert not loaded, loaded\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "grace_hopper_segmentation.npy").is_file()
