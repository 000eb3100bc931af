"""What a newcomer installs: one OpenCV build on purpose, the Space's system packages, the command line."""

import importlib.metadata
import re
import shutil
import subprocess
from pathlib import Path

import pytest

try:
    import tomllib  # novermin: Python 3.10 reads TOML with the backport below
except ModuleNotFoundError:
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
OPENCV_BUILDS = {"opencv-python", "opencv-python-headless", "opencv-contrib-python"}


def requirement_names(path: Path) -> list[str]:
    lines = [line.split("#")[0].strip() for line in path.read_text().splitlines()]
    return [re.split(r"[<>=!~\[; ]", line)[0].lower() for line in lines if line and not line.startswith("-")]


def test_one_opencv_build_the_one_the_detector_requires():
    detector_needs = {
        re.split(r"[<>=!~\[; ]", requirement)[0].lower()
        for requirement in importlib.metadata.requires("ultralytics")
        if "extra ==" not in requirement
    } & OPENCV_BUILDS
    assert detector_needs == {"opencv-python"}
    assert set(requirement_names(ROOT / "requirements.txt")) & OPENCV_BUILDS == detector_needs
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert {re.split(r"[<>=!~\[; ]", d)[0] for d in project["dependencies"]} & OPENCV_BUILDS == detector_needs


def test_the_space_installs_the_libraries_the_gui_build_loads():
    packages = (ROOT / "packages.txt").read_text().split()
    assert packages == ["libgl1", "libglib2.0-0"], "one Debian package name per line, nothing else"


def test_readme_commands_work_after_the_readme_install():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["scripts"] == {"sapiens2": "sapiens2.cli:main"}
    readme = (ROOT / "README.md").read_text()
    command = re.compile(r"\s*(python -m )?sapiens2 \w")
    commands = [line.strip() for line in readme.splitlines() if command.match(line)]
    assert commands and all(command.startswith("python -m sapiens2 ") for command in commands), commands


@pytest.mark.parametrize(
    "path",
    [
        "checkpoints/facebook/sapiens2-pose-0.4b/model.safetensors",  # the README's offline layout
        "runs/pose/final/model.safetensors",  # the README's training outputs
        "yolo11m.pt",  # the person detector ultralytics fetches into the working folder
    ],
)
def test_what_the_readme_makes_in_the_checkout_is_ignored_by_git(path):
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    checked = subprocess.run(
        ["git", "check-ignore", "--quiet", "--no-index", path], cwd=ROOT, capture_output=True, timeout=30
    )
    assert checked.returncode == 0, f"{path} is not in .gitignore"


def test_the_offline_section_says_where_the_default_detector_comes_from():
    from sapiens2.vision.detector import DEFAULT_WEIGHTS

    offline = (ROOT / "README.md").read_text().split("## Offline", 1)[1].split("\n## ", 1)[0]
    assert f"https://github.com/ultralytics/assets/releases/download/v8.3.0/{DEFAULT_WEIGHTS}" in offline
    assert "--detector" in offline and "SAPIENS2_DETECTOR" in offline
