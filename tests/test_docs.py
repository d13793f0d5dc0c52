"""Every Python block in the README and in docs/ runs, so no snippet can rot.

The blocks of one file run in order in one namespace, as a reader would paste them into one session, in the
test's own empty folder (conftest), which holds what the blocks name: ``photo.jpg`` (one of scikit-learn's two
photos) for the README, whose reader brings one (every guide makes the photo it reads), and a tiny
``pizza_steak_sushi/{train,test}`` folder tree. A block that uses a big model where the test uses a small one says
so in a comment. Throughout, ``vit_b_16`` is a tiny stand-in (Table 1 counts are checked in
tests/test_model_presets.py): ``create_vit("vit_b_16", pretrained=True)`` runs the real
download, hash check, conversion and naming, against a server on 127.0.0.1 that serves a tiny stand-in of
vit_b_16's published file (nothing else is contacted). The README's own shape is held too: its two commands
first, its links pointing at files that exist.
"""

from __future__ import annotations

import hashlib
import io
import re
from pathlib import Path

import pytest
import torch
from _figures import unreadable
from _interop import TINY
from _loopback import serve
from matplotlib.figure import Figure
from PIL import Image

from vit_einops import ViT
from vit_einops.images import sample_images
from vit_einops.interop import to_torchvision
from vit_einops.presets import PRESETS
from vit_einops.pretrained import PRETRAINED, PublishedWeights
from vit_einops.preprocess import Preprocessing

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


# The pages that ask readers for a photo of their own ("photo.jpg"); every other guide makes the photo it reads, so
# that a reader who runs it as written gets as far as its test does.
READER_PHOTO = {"README.md"}


@pytest.fixture
def reader_files(request):
    """photo.jpg (for the pages of READER_PHOTO only) and a class-per-folder tree of crops of the sample photos, in
    the test's own folder."""
    photos, _ = sample_images()
    if request.node.callspec.params["path"].name in READER_PHOTO:
        photos[0].save("photo.jpg")
    for split, count in (("train", 4), ("test", 2)):
        for c, name in enumerate(["pizza", "steak", "sushi"]):
            folder = Path("pizza_steak_sushi", split, name)
            folder.mkdir(parents=True)
            for i in range(count):
                photos[c % 2].crop((40 * c + 10 * i, 0, 40 * c + 10 * i + 200, 200)).save(folder / f"{i}.jpg")


@pytest.fixture
def tiny_vit_b_16(monkeypatch, tmp_path):
    """vit_b_16's published weights replaced by a tiny model's, served on 127.0.0.1 under the real file's form."""
    config = {**TINY, "num_classes": 1000}
    buffer = io.BytesIO()
    torch.save(to_torchvision(ViT(**config)), buffer)
    data = buffer.getvalue()
    file = f"vit_b_16-{hashlib.sha256(data).hexdigest()[:8]}.pth"
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    monkeypatch.setitem(PRESETS, "vit_b_16", config)
    size = config["image_size"]
    monkeypatch.setitem(
        PRETRAINED, "vit_b_16", PublishedWeights("torchvision", file, size, 1000, Preprocessing.torchvision(size))
    )
    with serve() as site:
        site.files[file] = data
        monkeypatch.setenv("VIT_EINOPS_WEIGHTS_URL", site.url)
        yield site


@pytest.fixture
def saved_figures(monkeypatch):
    """(name, figure, PNG width in px) of every figure the blocks save, by fig.savefig or save_figure (which renders
    through it into memory): the name is the file, or the figure's title for a render into memory."""
    saved = []
    savefig = Figure.savefig

    def record(fig, fname, *args, **kwargs):
        savefig(fig, fname, *args, **kwargs)
        data = fname.getvalue() if isinstance(fname, io.BytesIO) else Path(fname).read_bytes()
        title = fig.get_suptitle() or next((ax.get_title() for ax in fig.get_axes() if ax.get_title()), "")
        name = f"figure {title!r}" if isinstance(fname, io.BytesIO) else str(fname)
        saved.append((name, fig, Image.open(io.BytesIO(data)).size[0]))

    monkeypatch.setattr(Figure, "savefig", record)
    return saved


@pytest.mark.parametrize("path", [p for p in DOCS if blocks(p, "python")], ids=lambda p: str(p.relative_to(ROOT)))
def test_python_blocks_run(path, reader_files, tiny_vit_b_16, saved_figures):
    """Each file's blocks run; every figure they save is at least 600 px wide, with its text (a colour bar's label
    too) inside the picture and no two titles on top of each other."""
    namespace: dict = {"__name__": "__docs__"}
    for line, source in blocks(path, "python"):
        where = f"{path.relative_to(ROOT)}:{line}"
        try:
            exec(compile(source, where, "exec"), namespace)
        except Exception as err:
            pytest.fail(f"the Python block at {where} failed: {type(err).__name__}: {err}")
    assert [p for _, p in tiny_vit_b_16.requests] in ([], [PRETRAINED["vit_b_16"].file])  # at most once: cached
    if any(re.search(r"savefig\(|save_figure\(", source) for _, source in blocks(path, "python")):
        assert saved_figures  # the recording sees the blocks' saves, or the checks below would pass on nothing
    assert {name: width for name, _, width in saved_figures if width < 600} == {}
    assert {name: unreadable(fig) for name, fig, _ in saved_figures} == {name: [] for name, _, _ in saved_figures}


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


def test_the_files_docs_name_for_inspect_are_the_ones_it_writes():
    """Every file name (`NAME.png`, `NAME.npz`) in a prose paragraph about inspect is one of the files its report
    holds, and the docs name each of them somewhere."""
    from vit_einops.inspect.report import REPORT_FILES

    named = {}
    for path in DOCS:
        prose = FENCE.sub("", path.read_text(encoding="utf-8"))
        for paragraph in re.split(r"\n\s*\n", prose):
            if re.search(r"\binspect\b", paragraph):
                for name in re.findall(r"`([\w-]+\.(?:png|npz))`", paragraph):
                    named.setdefault(name, path.relative_to(ROOT))
    assert {name: doc for name, doc in named.items() if name not in REPORT_FILES} == {}
    assert set(named) == REPORT_FILES


def test_the_docs_family_table_is_the_registry():
    """docs/models.md's table of families is the family registry's own rendering: a family added to
    vit_einops.presets.FAMILIES fails here until the docs show it (print family_table() and paste it)."""
    from vit_einops.presets import family_table

    text = (ROOT / "docs" / "models.md").read_text()
    block = text.split("<!-- family-table -->\n", 1)[1].split("\n<!-- /family-table -->", 1)[0]
    assert block == family_table()
