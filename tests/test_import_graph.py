"""The package's layers hold: no import cycle, no import up a layer or between two tools (tests/import_graph.py)."""

from __future__ import annotations

import re

import import_graph
import pytest


def test_no_cycles_and_no_layer_violations():
    edges = import_graph.graph()
    assert import_graph.cycles(edges) == []
    assert import_graph.violations(edges) == []


def test_function_level_and_lazy_imports_count(tmp_path):
    """The checker sees an import inside a function and a name taken from a package's lazy exports, so neither can
    hide a cycle or an upward import."""
    pkg = tmp_path / "vit_einops"
    (pkg / "train").mkdir(parents=True)
    (pkg / "network").mkdir()
    (pkg / "__init__.py").write_text('_EXPORTS = {"ViT": "network.model"}\n')
    (pkg / "network" / "__init__.py").write_text("")
    (pkg / "network" / "model.py").write_text("def f():\n    from ..train import loop\n")
    (pkg / "train" / "__init__.py").write_text("")
    (pkg / "train" / "loop.py").write_text("from .. import ViT\n")
    edges = import_graph.graph(pkg)
    assert edges["vit_einops.network.model"] == {"vit_einops.train.loop"}
    assert edges["vit_einops.train.loop"] == {"vit_einops.network.model"}
    assert import_graph.cycles(edges) == [["vit_einops.network.model", "vit_einops.train.loop"]]
    assert import_graph.violations(edges) == [
        "vit_einops.network.model (core) imports vit_einops.train.loop (tools): up a layer"
    ]


def test_the_network_imports_nothing_of_the_core_above_it():
    """network/ is the core's bottom: an import of inputs, prediction or any other core module from it is a violation
    (the forward pass reads no budget, file or environment through them)."""
    edges = {
        "vit_einops.network.model": {"vit_einops.inputs", "vit_einops.preprocess", "vit_einops.base.checks"},
        "vit_einops.inputs": set(),
        "vit_einops.preprocess": set(),
        "vit_einops.base.checks": set(),
    }
    assert import_graph.violations(edges) == [
        "vit_einops.network.model imports vit_einops.inputs: network/ imports only base, itself and {'preprocess'}"
    ]


def test_tools_may_not_import_each_other_and_new_units_need_a_layer():
    edges = {
        "vit_einops.train.loop": {"vit_einops.inspect.record"},
        "vit_einops.inspect.record": set(),
        "vit_einops.newthing": set(),
    }
    assert import_graph.violations(edges) == [
        "vit_einops.newthing: in no layer (add its unit 'newthing' to LAYERS)",
        "vit_einops.train.loop imports vit_einops.inspect.record: between two tools units",
    ]


def _packages_with_exports():
    import importlib
    import pkgutil

    import vit_einops

    yield vit_einops
    for info in pkgutil.iter_modules(vit_einops.__path__, "vit_einops."):
        if info.ispkg:
            package = importlib.import_module(info.name)
            if hasattr(package, "_EXPORTS"):
                yield package


@pytest.mark.parametrize("package", list(_packages_with_exports()), ids=lambda p: p.__name__)
def test_no_lazy_export_shares_its_name_with_a_submodule(package):
    """Importing a submodule binds it on its package under its own name: an export of the same name (a function
    ``predict`` beside a module ``predict.py``) would turn into the module as soon as anything imported it, and
    ``from vit_einops import predict`` would hand back a module."""
    import pkgutil

    submodules = {info.name for info in pkgutil.iter_modules(package.__path__)}
    assert sorted(set(package._EXPORTS) & submodules) == []


def test_an_exported_function_survives_its_modules_import():
    import importlib

    importlib.import_module("vit_einops.prediction")  # the module that defines predict, and one that imports it
    importlib.import_module("vit_einops.inspect.report")
    from vit_einops import predict

    assert callable(predict)


# Every way torch offers to attach a function to a module or a tensor.
HOOK_CALL = re.compile(
    r"\.register_(?:module_)?(?:forward|forward_pre|full_backward|full_backward_pre|backward)_hook\(|\.register_hook\("
)


def test_only_the_network_attaches_hooks():
    """The probe sites (vit_einops/network, docs/probes.md) are the one way a tool reads or changes an activation:
    no module elsewhere registers a torch hook. summary.py is the one exception: it numbers torchsummary's rows by
    hooking the same modules torchsummary hooks, which no probe site stands for (a module's firing, not a value)."""
    allowed = {"summary.py"}
    paths = [path.relative_to(import_graph.ROOT) for path in import_graph.ROOT.rglob("*.py")]
    found = sorted(
        f"{path}:{number}"
        for path in paths
        if path.parts[0] != "network" and str(path) not in allowed
        for number, line in enumerate((import_graph.ROOT / path).read_text().splitlines(), 1)
        if HOOK_CALL.search(line)
    )
    assert found == []
    assert HOOK_CALL.search("handle = norm.register_forward_hook(fn)") and HOOK_CALL.search("z.register_hook(fn)")
    assert not HOOK_CALL.search("model.run_with_hooks(x, fwd_hooks)")
