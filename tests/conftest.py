import dataclasses
import os
from pathlib import Path

import pytest
import torch
from hypothesis import settings

import vit_einops

# The same number of examples everywhere (the README's command finishes in time on 2 cores); CI's are fixed and
# reproducible, a local run draws fresh ones each time.
settings.register_profile("ci", max_examples=20, deadline=None, derandomize=True, print_blob=True)
settings.register_profile("dev", max_examples=20, deadline=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))

# The folder holding the vit_einops under test: subprocesses import it from there, whatever their working directory.
SOURCE_ROOT = str(Path(vit_einops.__file__).resolve().parent.parent)


# torch's thread count when the session began: commands run in-process (``main(["train", "--threads", "1", ...])``,
# in tests and in module-scoped fixtures) set it, and no test may inherit that.
# Under pytest-xdist the cores are shared between the workers: each gets its share, so no torch thread spin-waits
# for a core another worker holds.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    torch.set_num_threads(max(1, torch.get_num_threads() // _WORKERS))
SESSION_THREADS = torch.get_num_threads()


@pytest.fixture(autouse=True)
def _torch_state():
    """Every test starts from seed 0 on the session's thread count."""
    torch.manual_seed(0)
    torch.set_num_threads(SESSION_THREADS)
    yield
    torch.set_num_threads(SESSION_THREADS)


@pytest.fixture(autouse=True, scope="session")
def _no_disk_flush():
    """os.fsync is a no-op in the test processes. A flush to the disk only counts against a power loss or a kernel
    crash, which no test can cause; a killed process (kill -9, what the write tests do) leaves its written pages to
    the kernel all the same, so every outcome a test checks is the same with or without it. Each real flush waits
    for the disk, behind every other process's writes: on a shared machine the writing tests (test_hostile_train.py)
    spent half their time there. The write tests still see each call: they wrap os.fsync to count or kill at it.
    Subprocesses (the command line at its process boundary, torchrun) keep the real one."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(os, "fsync", lambda fd: None)
        yield


@pytest.fixture(autouse=True)
def _own_working_directory(tmp_path_factory, monkeypatch):
    """Each test runs in an empty folder of its own: nothing it writes by default (./bench-results, runs/) lands in,
    and nothing already in the folder pytest was started from changes its outcome. Subprocesses find the package
    under test through PYTHONPATH, not through the working directory."""
    monkeypatch.chdir(tmp_path_factory.mktemp("cwd"))
    # Commands run on one thread unless a test says otherwise: the same count on any machine, and no command waits
    # for the thread policy's window (vit_einops.base.threads) before its work; tests/test_threads.py unsets it.
    monkeypatch.setenv("VIT_EINOPS_THREADS", "1")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [SOURCE_ROOT, os.environ.get("PYTHONPATH")])))


# Integrated gradients run the model forward and backward once per step, 50 steps by default (captum's n_steps): 50
# times the cost of any other method, in every report, page and faithfulness run that computes every method. Tests
# take IG_TEST_STEPS unless they pass steps or ask for the default (``default_ig_steps``); the steps' convergence is
# tested with explicit steps (tests/test_integrated_gradients.py).
IG_TEST_STEPS = 2


@pytest.fixture(autouse=True, scope="session")
def _few_integrated_gradients_steps():
    """For the whole session, so that a module's fixture (a report, a page, maps) and its tests take the same."""
    from vit_einops.inspect.methods import METHODS

    method = METHODS["integrated-gradients"]
    few = dataclasses.replace(method, params={**method.params, "steps": IG_TEST_STEPS})
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(METHODS, method.name, few)
        yield method


@pytest.fixture
def default_ig_steps(monkeypatch, _few_integrated_gradients_steps):
    """METHODS' integrated gradients with their published default steps, for a test that reads them."""
    from vit_einops.inspect.methods import METHODS

    monkeypatch.setitem(METHODS, _few_integrated_gradients_steps.name, _few_integrated_gradients_steps)


@pytest.fixture
def one_thread():
    """torch on one thread for the test: the tiny models run fastest so, where two threads spin-wait against each
    other on a busy 2-core machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def unrendered(monkeypatch):
    """write_report's arrays without its figures: each plot function is skipped and each PNG is a stub ("png").
    For tests of the model's calls and the arrays; drawing is most of a report's time, and test_figures.py draws
    each figure at its default size, checking it."""
    import vit_einops.inspect.report as report_module

    for name in dir(report_module):
        if name.startswith("plot_"):
            monkeypatch.setattr(report_module, name, lambda *args, **kwargs: None)
    monkeypatch.setattr(report_module, "save_figure", lambda fig, path, dpi=120: Path(path).write_bytes(b"png"))


@pytest.fixture
def rendered_only(monkeypatch):
    """``rendered_only(*names)``: write_report makes every figure (its titles and texts are there to read) but
    renders only the named ones (``"attention"`` for attention.png) as its PNGs; every other PNG is a stub ("png").
    For tests that read a figure or two of a whole report: rendering is most of a report's time."""
    import vit_einops.inspect.report as report_module

    save, names = report_module.save_figure, set()

    def save_named(fig, path, *args, **kwargs):
        if Path(path).stem in names:
            return save(fig, path, *args, **kwargs)
        Path(path).write_bytes(b"png")
        return Path(path)

    monkeypatch.setattr(report_module, "save_figure", save_named)
    return lambda *chosen: names.update(chosen)


# What a training run's figures (curves.png, confusion.png) are written as where a test reads none of them.
STUB_PNG = b"\x89PNG\r\n\x1a\n stub"


def unrender_training_figures(patch):
    """Make ``patch`` (a pytest MonkeyPatch) stub the rendering of a training run's figures: each is made, then
    written as STUB_PNG through the run's own atomic writes, so its files and write points are the real ones.
    base.plot.figure_png is where every PNG is rendered, so a report's PNGs are stubs too."""
    import vit_einops.base.plot as plot

    patch.setattr(plot, "figure_png", lambda fig, dpi=None: STUB_PNG)


@pytest.fixture(scope="session")
def training_figures_stub():
    """:func:`unrender_training_figures`, for a module-scoped fixture (test_hostile_train.py's, whose module runs
    and forked children all write stubs)."""
    return unrender_training_figures


@pytest.fixture
def unrendered_training(monkeypatch):
    """A training run's curves.png and confusion.png made but not rendered (three quarters of a tiny run's time),
    for tests that read neither (test_train.py's test_curves_... and test_hostile_edges.py read them). Every PNG
    that base.plot renders is a stub then, a report's too: a test that reads a report's PNGs takes rendered_only."""
    unrender_training_figures(monkeypatch)


# The longest files first: pytest-xdist hands whole files (--dist loadfile) to whichever worker is free, so a long
# file that starts last keeps one worker busy while the other idles; longest first evens out the two workers' ends.
LONGEST_FILES = (
    "test_hostile_train.py", "test_train.py", "test_train_ddp.py", "test_hostile_writes.py", "test_docs.py",
    "test_figures.py", "test_inspect_cli.py", "test_pretrained.py", "test_explore_browser.py",
)  # fmt: skip


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(LONGEST_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the order within a file is kept


def pytest_collection_finish(session):
    """After collection (every test module, torch, matplotlib and the rest imported), the objects alive then are
    moved out of the garbage collector's reach: they live until the process ends anyway, and each full collection
    (Python's own, and the gc.collect the bench runs before each job) would walk all of them again. Garbage made
    later is collected as before."""
    import gc

    gc.collect()
    gc.freeze()
