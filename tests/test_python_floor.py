"""Nothing in the project needs a Python newer than 3.10, ZeroGPU's: the check passes here, and fails on
each kind of 3.11 feature, so that it really reads what the files use."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
from python_floor import PYTHON_FLOOR, ROOT, SOURCES, check  # noqa: E402

NEWER = {
    "module": "import tomllib\n",
    "syntax": "try:\n    pass\nexcept* ValueError:\n    pass\n",
    "stdlib member": "import datetime\n\nprint(datetime.UTC)\n",
    "deferred annotation": "from __future__ import annotations\n\nimport typing\n\nme: typing.Self\n",
}


def test_the_floor_is_zerogpus_python():
    front_matter = (ROOT / "README.md").read_text().split("---")[1]
    assert f'python_version: "{PYTHON_FLOOR}"' in front_matter.splitlines()


def test_nothing_in_the_project_needs_a_newer_python():
    done = check([ROOT / source for source in SOURCES])
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("kind", sorted(NEWER))
def test_a_311_feature_fails_the_check(kind, tmp_path):
    path = tmp_path / "newer.py"
    path.write_text(NEWER[kind])
    done = check([path])
    assert done.returncode != 0 and "3.11" in done.stdout, done.stdout + done.stderr


def test_torch_long_is_not_mistaken_for_python_2(tmp_path):
    path = tmp_path / "labels.py"
    path.write_text("import torch\n\nlabels = torch.zeros(2).long()\n")
    assert check([path]).returncode == 0
