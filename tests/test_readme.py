"""The README's shape: short, what a newcomer needs first, every link alive, its Python example runnable."""

import re
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MAX_LINES = 250
FIRST_SCREEN = 60
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def readme_lines() -> list[str]:
    return README.read_text(encoding="utf-8").splitlines()


def fenced_blocks(text: str, language: str) -> list[str]:
    """The bodies of the ```language blocks of a Markdown text."""
    return re.findall(rf"^```{language}\n(.*?)^```", text, flags=re.S | re.M)


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = page.read_text(encoding="utf-8")
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)  # a "# comment" in a block is no heading
    return {slug(line.lstrip("#")) for line in text.splitlines() if re.match(r"#{1,6} ", line)}


def local_links(page: Path) -> list[tuple[Path, str]]:
    """(file, anchor) of every link of `page` to this repository (the page itself for "#anchor")."""
    found = []
    for target in LINK.findall(page.read_text(encoding="utf-8")):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        found.append(((page.parent / path).resolve() if path else page, anchor))
    return found


def test_the_readme_is_short_and_keeps_its_front_matter_first():
    lines = readme_lines()
    assert len(lines) <= MAX_LINES, f"README.md has {len(lines)} lines; move details to docs/"
    assert lines[0] == "---" and "app_file: app.py" in lines[: lines.index("---", 1)]


def test_the_first_screen_says_what_it_is_shows_it_and_how_to_install_run_and_test():
    lines = readme_lines()
    body = lines[lines.index("---", 1) + 1 :]
    first = "\n".join(lines[:FIRST_SCREEN])
    assert any(line.startswith("# ") for line in body[:5]), "the title right after the front matter"
    assert "Sapiens2" in first and "PyTorch" in first
    pictures = [target for target in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", first)]
    assert pictures and all((ROOT / picture).is_file() for picture in pictures), pictures
    commands = [line.strip() for block in fenced_blocks(first + "\n", "bash") for line in block.splitlines()]
    assert any(command.startswith("pip install -r requirements.txt") for command in commands)
    assert any(command.endswith("python app.py") for command in commands)
    assert "pip install -r requirements-dev.txt && python -m pytest -q" in commands, ".ci/run runs this"
    assert re.search(r"\d+-\d+ minutes on two CPU cores", first), "how long the tests take"


def test_spaces_the_command_line_and_python_each_have_their_section():
    text = README.read_text(encoding="utf-8")
    sections = {line[3:] for line in text.splitlines() if line.startswith("## ")}
    assert {"Hugging Face Spaces", "Command line", "Python"} <= sections
    assert any("python -m sapiens2 " in block for block in fenced_blocks(text, "bash"))
    assert len(fenced_blocks(text, "python")) == 1


def test_every_link_of_the_readme_and_of_the_docs_it_links_leads_somewhere():
    pages, seen, broken = [README], set(), []
    while pages:
        page = pages.pop()
        if page in seen:
            continue
        seen.add(page)
        for path, anchor in local_links(page):
            if not path.exists():
                broken.append(f"{page.name}: {path.relative_to(ROOT)} is missing")
            elif path.suffix == ".md":
                if anchor and anchor not in anchors(path):
                    broken.append(f"{page.name}: {path.name} has no #{anchor}")
                pages.append(path)
    assert not broken, broken
    docs = {path.name for path in seen if path.parent == ROOT / "docs"}
    assert {"settings.md", "hosting.md", "formats.md", "training.md", "command-line.md"} <= docs


def test_the_readme_python_example_runs_as_written(tiny_mirror, person_yolo, tmp_path, monkeypatch):
    (example,) = fenced_blocks(README.read_text(encoding="utf-8"), "python")
    shutil.copytree(ROOT / "assets", tmp_path / "assets")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SAPIENS2_CHECKPOINT_DIR", str(tiny_mirror))
    monkeypatch.setenv("SAPIENS2_DETECTOR", person_yolo)
    monkeypatch.setenv("SAPIENS2_DEVICE", "cpu")
    scope: dict = {}
    exec(compile(example, "README.md", "exec"), scope)
    assert scope["result"].task == "pose"
    assert [path.name for path in scope["files"]] == ["grace_hopper_pose.json", "grace_hopper_controlnet.png"]
    assert all(path.is_file() for path in scope["files"])


@pytest.mark.parametrize("page", ["formats.md", "command-line.md"])
def test_the_docs_say_keypoint_formats_come_beside_the_native_file(page):
    text = (ROOT / "docs" / page).read_text(encoding="utf-8")
    assert "_pose.json" in text and "always" in text


def test_the_docs_python_snippets_name_only_what_a_task_result_has():
    from dataclasses import fields

    from sapiens2.outputs.results import TaskResult

    has = {field.name for field in fields(TaskResult)} | {name for name in dir(TaskResult) if name[0] != "_"}
    for page in [README, *(ROOT / "docs").glob("*.md")]:
        for block in fenced_blocks(page.read_text(encoding="utf-8"), "python"):
            for named in re.findall(r"# a TaskResult: ([^\n]*)", block):
                attributes = re.findall(r"\.(\w+)", named)
                assert attributes and set(attributes) <= has, (page.name, named)
