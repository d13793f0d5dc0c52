"""Every Python block in the README and in docs/ runs, so no snippet can rot.

The blocks of one file run in order in one namespace, as a reader would paste them into one session, in the
test's own empty folder (conftest). A block that needs a big model says in a comment where it uses a small one.
The README's own shape is held too: its two commands first, its links pointing at files that exist.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "benchmarks" / "README.md"]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)


def blocks(path: Path, language: str) -> list[tuple[int, str]]:
    """(first line number, source) of each fenced block of ``language`` in ``path``."""
    text = path.read_text(encoding="utf-8")
    return [
        (text.count("\n", 0, m.start(2)) + 1, m[2]) for m in FENCE.finditer(text) if m[1] == language
    ]


def test_blocks_are_found():
    """The fence pattern sees the README's blocks: a broken pattern would make every test below vacuous."""
    assert [lang for lang in ("bash", "python") if blocks(ROOT / "README.md", lang)] == ["bash", "python"]


@pytest.mark.parametrize("path", [p for p in DOCS if blocks(p, "python")], ids=lambda p: str(p.relative_to(ROOT)))
def test_python_blocks_run(path):
    namespace: dict = {"__name__": "__docs__"}
    for line, source in blocks(path, "python"):
        where = f"{path.relative_to(ROOT)}:{line}"
        try:
            exec(compile(source, where, "exec"), namespace)
        except Exception as err:
            pytest.fail(f"the Python block at {where} failed: {type(err).__name__}: {err}")


def test_readme_begins_with_the_two_commands():
    """Setup-and-run, then the tests: the first block of the README, and nothing else in it."""
    first_fence = FENCE.search((ROOT / "README.md").read_text(encoding="utf-8"))
    assert first_fence[1] == "bash"
    first = first_fence[2]
    commands = [c for c in first.splitlines() if c.strip() and not c.lstrip().startswith("#")]
    assert len(commands) == 2, commands
    assert "pip install" in commands[0] and "vit-einops" in commands[0]
    assert "pytest" in commands[1]


def test_readme_is_a_front_door():
    """Short enough to read in five minutes; guides live in docs/."""
    assert len((ROOT / "README.md").read_text(encoding="utf-8").splitlines()) <= 200


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(path):
    text = path.read_text(encoding="utf-8")
    broken = [
        target
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
        if "://" not in target and not (path.parent / target).exists()
    ]
    assert broken == []
