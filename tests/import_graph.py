"""The package's import graph, read from the source (every ``import``, at module level or inside a function), and
the layers it must respect. ``python tests/import_graph.py`` prints the graph, its cycles and the imports that
break a layer; ``tests/test_import_graph.py`` keeps both at zero.

The layers, lowest first. A module imports from its own unit or from a lower layer, never upward; two units of one
layer of tools never import each other (what two tools share moves down into the core).

    base      helpers with no model in them: checks, atomic I/O, verified downloads, the JSON reader, the memory
              budget, lazy exports, init, Sequential, plotting, text
    core      the model and what every tool needs of it: config, layers, ViT and the sizes a config implies
              (network/, the bottom of the core, which imports only base, itself and the plain Preprocessing record a
              model carries), presets, preprocessing, images, predictions, the state-dict checks, the model file and
              ImageNet-1k's class names
    tools     interop (weights from and to other libraries), train, inspect, bench: each its own unit
    views     explore, the interactive page of what inspect computes
    door      sources: the one front door that loads a model in any form, above the converters and the checkpoints;
              pretrained: create_vit with published weights, through sources
    commands  the command line
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path

PACKAGE = "vit_einops"
ROOT = Path(__file__).resolve().parent.parent / PACKAGE

# Each unit (a module, or a subpackage with everything under it) and its layer. A new module must be placed here.
LAYERS: dict[str, tuple[str, ...]] = {
    "base": ("", "base"),
    "core": (
        "network",
        "presets",
        "reference",
        "summary",
        "preprocess",
        "images",
        "inputs",
        "prediction",
        "statedict",
        "modelfile",
        "imagenet",
    ),
    "tools": ("interop", "train", "inspect", "bench"),
    "views": ("explore",),
    "door": ("sources", "pretrained"),
    "commands": ("commands", "__main__"),
}
RANK = {layer: i for i, layer in enumerate(LAYERS)}
# Layers whose units may import each other (the core is one body of code, as is the command line, and pretrained
# loads through sources; their order is kept by having no cycles).
SHARED = {"base", "core", "door", "commands"}
# The network is the core's bottom: what it may import besides base and itself. preprocess is the record of how an
# image becomes a model's input (it imports only base); nothing the network imports may bring a budget, a file or a
# tool into the model's code.
NETWORK_IMPORTS = {"preprocess"}


def modules(root: Path = ROOT) -> dict[str, tuple[Path, bool]]:
    """Every module of the package: dotted name -> (file, is a package's __init__)."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        found[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return found


def _lazy_exports(tree: ast.Module) -> dict[str, str]:
    """A package's ``_EXPORTS`` (name -> submodule) and ``_DEPRECATED`` (name -> (submodule, ...)) literals."""
    exports: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") in ("_EXPORTS", "_DEPRECATED") for t in node.targets):
            for name, value in ast.literal_eval(node.value).items():
                exports[name] = value if isinstance(value, str) else value[0]
    return exports


def graph(root: Path = ROOT) -> dict[str, set[str]]:
    """module -> the package's modules it imports. A name taken from a package's lazy exports counts as an import
    of the submodule behind it; importing a submodule counts as an import of that submodule only."""
    mods = modules(root)
    trees = {name: ast.parse(path.read_text(), str(path)) for name, (path, _) in mods.items()}
    lazy = {name: _lazy_exports(tree) for name, tree in trees.items() if mods[name][1]}
    edges: dict[str, set[str]] = defaultdict(set)
    for name, tree in trees.items():
        package = name if mods[name][1] else name.rpartition(".")[0]
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")
                    base = base[: len(base) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                candidates = []
                for alias in node.names:
                    if f"{target}.{alias.name}" in mods:
                        candidates.append(f"{target}.{alias.name}")
                    elif alias.name in lazy.get(target, {}):
                        candidates.append(f"{target}.{lazy[target][alias.name]}")
                    else:
                        candidates.append(target)
            elif isinstance(node, ast.Import):
                candidates = [alias.name for alias in node.names]
            else:
                continue
            edges[name].update(c for c in candidates if c in mods and c != name)
    return {name: edges.get(name, set()) for name in mods}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in edges:
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def unit(module: str) -> str:
    """The layer unit a module belongs to: its first name under the package ("" for the package itself)."""
    return module.split(".")[1] if "." in module else ""


def layer_of(module: str) -> str | None:
    return next((layer for layer, units in LAYERS.items() if unit(module) in units), None)


def violations(edges: dict[str, set[str]]) -> list[str]:
    """Every import that runs up a layer or across between two units of a layer of tools, and every module that
    no layer places."""
    found = [f"{m}: in no layer (add its unit {unit(m)!r} to LAYERS)" for m in edges if layer_of(m) is None]
    for source, targets in sorted(edges.items()):
        for target in sorted(targets):
            src_layer, dst_layer = layer_of(source), layer_of(target)
            if src_layer is None or dst_layer is None or unit(source) == unit(target):
                continue
            if RANK[dst_layer] > RANK[src_layer]:
                found.append(f"{source} ({src_layer}) imports {target} ({dst_layer}): up a layer")
            elif unit(source) == "network" and dst_layer == "core" and unit(target) not in NETWORK_IMPORTS:
                found.append(f"{source} imports {target}: network/ imports only base, itself and {NETWORK_IMPORTS}")
            elif dst_layer == src_layer and src_layer not in SHARED:
                found.append(f"{source} imports {target}: between two {src_layer} units")
    return found


def main() -> int:
    edges = graph()
    for layer, units in LAYERS.items():
        print(f"[{layer}]")
        for name in sorted(m for m in edges if unit(m) in units):
            targets = ", ".join(t.removeprefix(PACKAGE + ".") for t in sorted(edges[name])) or "-"
            print(f"  {name.removeprefix(PACKAGE + '.') or PACKAGE} -> {targets}")
    found_cycles, found_violations = cycles(edges), violations(edges)
    print(f"{len(edges)} modules, {sum(map(len, edges.values()))} imports, {len(found_cycles)} cycles, "
          f"{len(found_violations)} layer violations")
    for component in found_cycles:
        print("cycle:", " <-> ".join(component))
    for line in found_violations:
        print("violation:", line)
    return 1 if found_cycles or found_violations else 0


if __name__ == "__main__":
    sys.exit(main())
