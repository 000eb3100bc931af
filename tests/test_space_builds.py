"""What a Space's builder reads, read the same way: the front matter's Python, and the torch and
torchvision versions requirements.txt admits, for ZeroGPU (its own list of torch builds) and for pip."""

import re
from pathlib import Path

import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

try:
    import tomllib  # novermin: Python 3.10 reads TOML with the backport below
except ModuleNotFoundError:
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
# ZeroGPU's Python and the torch versions its builder installs (Hugging Face's hub-docs,
# docs/hub/spaces-zerogpu.md, "Supported versions"); a requirement outside the list fails the build with
# "No candidate PyTorch version found for ZeroGPU".
ZEROGPU_PYTHON = "3.10.13"
ZEROGPU_TORCH = ("2.1.0", "2.1.1", "2.1.2", "2.2.0", "2.2.2", "2.4.0", "2.5.1", "2.6.0", "2.7.1", "2.8.0")
# The pairs tested (.ci/run): each torchvision release requires exactly one torch.
TESTED = {"2.8.0": "0.23.0", "2.14.1": "0.29.1"}
NEWER = {"torch": ("2.14.2", "2.15.0"), "torchvision": ("0.29.2", "0.30.0")}


def front_matter() -> dict:
    return yaml.safe_load((ROOT / "README.md").read_text().split("---\n")[1])


def requirements(python: str) -> dict[str, SpecifierSet]:
    """requirements.txt as pip reads it on `python`: each package's specifier, markers evaluated."""
    found: dict[str, SpecifierSet] = {}
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if not line or line.startswith("-"):
            continue
        requirement = Requirement(line)
        environment = {"python_version": ".".join(python.split(".")[:2]), "python_full_version": python}
        if requirement.marker is None or requirement.marker.evaluate(environment):
            assert requirement.name not in found, f"{requirement.name} twice for Python {python}"
            found[requirement.name] = requirement.specifier
    return found


def test_the_front_matter_asks_for_zerogpus_python():
    assert str(front_matter()["python_version"]) == ".".join(ZEROGPU_PYTHON.split(".")[:2])
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert ZEROGPU_PYTHON in SpecifierSet(project["requires-python"])


def test_zerogpus_builder_finds_its_torch_and_pip_its_torchvision():
    wanted = requirements(ZEROGPU_PYTHON)
    candidates = [version for version in ZEROGPU_TORCH if version in wanted["torch"]]
    assert candidates, "No candidate PyTorch version found for ZeroGPU"
    chosen = max(candidates, key=lambda version: tuple(map(int, version.split("."))))
    assert chosen in TESTED and TESTED[chosen] in wanted["torchvision"]


def test_pip_gets_the_newest_tested_pair_on_every_python():
    newest = max(TESTED, key=lambda version: tuple(map(int, version.split("."))))
    for python in (ZEROGPU_PYTHON, "3.11.7", "3.12.1"):
        wanted = requirements(python)
        for name, version in (("torch", newest), ("torchvision", TESTED[newest])):
            assert version in wanted[name] and not any(v in wanted[name] for v in NEWER[name]), (python, name)
        for torch, vision in TESTED.items():
            assert torch in wanted["torch"] and vision in wanted["torchvision"], (python, torch)


def test_every_other_requirement_is_pinned_or_bounded_below():
    for python in (ZEROGPU_PYTHON, "3.11.7"):
        for name, specifier in requirements(python).items():
            assert re.search(r"(==|>=)", str(specifier)), f"{name} {specifier} on Python {python}"


def test_the_package_admits_zerogpus_torch():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    [torch] = [Requirement(line) for line in project["dependencies"] if Requirement(line).name == "torch"]
    assert all(version in torch.specifier for version in TESTED)
