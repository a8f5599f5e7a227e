"""Print trtforge's package import graph: each package -> the trtforge packages it imports (from grimp, which
import-linter brings). Run from anywhere with the installed package: ``python tests/packaging/import_graph.py``.

A "package" is a subpackage of build_engine (core, passes, ...), plugins (the registry) and plugins.lora, the
scheduler's core and its sim / integrations / cache, profiles and examples. ``--modules`` prints modules instead.
Lazy imports inside functions count: they are dependencies too.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict

ROOTS = ("trtforge.build_engine", "trtforge.plugins", "trtforge.scheduler", "trtforge.profiles", "trtforge.examples")
# Subpackages shown as their own node; every other module belongs to its root (trtforge.<folder>).
SUBPACKAGES = {"build_engine": ("cli", "core", "engine", "matrix", "passes", "precision", "quantize", "triton",
                                "verify"),
               "plugins": ("lora",), "scheduler": ("sim", "integrations", "cache")}


def package_of(module: str) -> str:
    """The graph node a module belongs to (see the module docstring)."""
    parts = module.split(".")
    if len(parts) > 2 and parts[2] in SUBPACKAGES.get(parts[1], ()):
        return ".".join(parts[:3])
    return ".".join(parts[:2])


def edges(modules: bool = False) -> dict[str, set[str]]:
    import grimp

    graph = grimp.build_graph(*ROOTS, cache_dir=None)
    out: dict[str, set[str]] = defaultdict(set)
    for importer in graph.modules:
        for imported in graph.find_modules_directly_imported_by(importer):
            a, b = (importer, imported) if modules else (package_of(importer), package_of(imported))
            if a != b:
                out[a].add(b)
            else:
                out.setdefault(a, set())
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modules", action="store_true", help="one line per module instead of per package")
    args = parser.parse_args(argv)
    graph = edges(args.modules)
    width = max(len(k) for k in graph)
    for node in sorted(graph):
        print(f"{node:<{width}} -> {', '.join(sorted(graph[node])) or '(nothing of trtforge)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
