"""docs/architecture.md's reading path stays true: every function it names is at the lines it gives, each einops pattern
is in its file, each probe site is the model's, and every site, every equation and the stated count are there.

When code moves, the failure names each row whose lines changed and the lines it should give.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from _tiny import tiny_vit

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "architecture.md"
# step | Eq. | `file` | `function` | first-last | einops | probe sites; cells may be empty
ROW = re.compile(
    r"^\|\s*(\d+)\s*\|([^|]*)\|\s*`([\w/]+\.py)`\s*\|\s*`([\w.]+)`\s*\|\s*(\d+)-(\d+)\s*\|([^|]*)\|([^|]*)\|$", re.M
)


def section() -> str:
    text = DOC.read_text(encoding="utf-8")
    start = text.index("## Reading the forward pass")
    return text[start : text.index("\n## ", start + 1)]


def rows() -> list[tuple[str, ...]]:
    found = ROW.findall(section())
    assert len(found) >= 20, "the reading path's table was not found: its rows' format changed?"
    return found


def span(path: Path, qualname: str) -> tuple[int, int] | None:
    """The first and last line of the function ``qualname`` ("Class.method" or "function") in ``path``."""
    node: ast.AST = ast.parse(path.read_text(encoding="utf-8"))
    for part in qualname.split("."):
        defs = (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
        node = next((n for n in ast.iter_child_nodes(node) if isinstance(n, defs) and n.name == part), None)
        if node is None:
            return None
    return node.lineno, node.end_lineno


def test_every_function_is_at_its_lines():
    wrong = []
    for step, _, file, name, first, last, *_ in rows():
        found = span(ROOT / "vit_einops" / file, name)
        assert found is not None, f"step {step}: {file} has no {name}"
        if found != (int(first), int(last)):
            wrong.append(f"step {step}: {file} {name} is at lines {found[0]}-{found[1]}, the doc says {first}-{last}")
    assert not wrong, "docs/architecture.md's reading path has moved:\n" + "\n".join(wrong)


def test_the_stated_count_is_the_rows_lines_and_files():
    lines = sum(int(r[5]) - int(r[4]) + 1 for r in rows())
    files = len({r[2] for r in rows()})
    stated = re.search(r"\*\*(\d+) lines in (\d+) files\*\*", section())
    assert stated and (int(stated[1]), int(stated[2])) == (lines, files), f"the pass is {lines} lines in {files} files"


def test_each_einops_pattern_is_in_its_file():
    for step, _, file, name, _, _, einops, _ in rows():
        source = (ROOT / "vit_einops" / file).read_text(encoding="utf-8")
        for pattern in re.findall(r"`([^`]*->[^`]*)`", einops):
            assert f'"{pattern}"' in source, f"step {step} ({name}): {file} has no pattern {pattern!r}"


def test_probe_sites_are_the_models_and_all_of_them():
    model = tiny_vit(depth=1)
    named = [site.replace("{l}", "0") for r in rows() for site in re.findall(r"`([\w.{}]+)`", r[7])]
    assert sorted(named) == sorted(model.probe_sites())


def test_every_equation_is_read():
    equations = {int(n) for r in rows() for n in re.findall(r"Eq\. (\d)", r[1])}
    assert equations == set(range(1, 9))
    assert [int(r[0]) for r in rows()] == list(range(1, len(rows()) + 1))
