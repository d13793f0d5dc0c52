"""The package's layers hold: no import cycle, no import up a layer or between two tools (tests/import_graph.py)."""

from __future__ import annotations

import import_graph


def test_no_cycles_and_no_layer_violations():
    edges = import_graph.graph()
    assert import_graph.cycles(edges) == []
    assert import_graph.violations(edges) == []


def test_function_level_and_lazy_imports_count(tmp_path):
    """The checker sees an import inside a function and a name taken from a package's lazy exports, so neither can
    hide a cycle or an upward import."""
    pkg = tmp_path / "vit_einops"
    (pkg / "train").mkdir(parents=True)
    (pkg / "__init__.py").write_text('_EXPORTS = {"ViT": "model"}\n')
    (pkg / "model.py").write_text("def f():\n    from .train import loop\n")
    (pkg / "train" / "__init__.py").write_text("")
    (pkg / "train" / "loop.py").write_text("from .. import ViT\n")
    edges = import_graph.graph(pkg)
    assert edges["vit_einops.model"] == {"vit_einops.train.loop"}
    assert edges["vit_einops.train.loop"] == {"vit_einops.model"}
    assert import_graph.cycles(edges) == [["vit_einops.model", "vit_einops.train.loop"]]
    assert import_graph.violations(edges) == [
        "vit_einops.model (core) imports vit_einops.train.loop (tools): up a layer"
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
