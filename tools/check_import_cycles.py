"""Fail when two or more modules import each other, directly or round a longer loop, at run time.

import-linter's contracts judge packages; this judges single files.  The graph is grimp's (import-linter's
own), over the root packages of ``[tool.importlinter]`` in pyproject.toml.  Imports inside functions count
(they run); imports under ``if TYPE_CHECKING:`` do not.  Prints every cycle with its import lines and exits
1; run from the project root: ``python tools/check_import_cycles.py``.
"""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parent.parent


def root_packages() -> list[str]:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return list(tomllib.load(f)["tool"]["importlinter"]["root_packages"])


def cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Every loop of imports, as the modules along it (first == last), each loop once.

    An import A -> B closes a loop exactly when B reaches A again; grimp finds the shortest way back.
    """
    loops: dict[frozenset[str], list[str]] = {}
    for importer in sorted(graph.modules):
        for imported in sorted(graph.find_modules_directly_imported_by(importer)):
            back = graph.find_shortest_chain(importer=imported, imported=importer)
            if back is not None:
                loops.setdefault(frozenset(back), [importer, *back])
    return list(loops.values())


def describe(graph: grimp.ImportGraph, loop: list[str]) -> list[str]:
    lines = []
    for importer, imported in zip(loop, loop[1:], strict=False):
        details = graph.get_import_details(importer=importer, imported=imported)
        where = ", ".join(f"l.{d['line_number']}: {d['line_contents']}" for d in details)
        lines.append(f"  {importer} -> {imported}  ({where})")
    return lines


def main() -> int:
    sys.path.insert(0, str(ROOT))  # benchmarks/ is not installed; the others resolve to this tree either way
    graph = grimp.build_graph(*root_packages(), exclude_type_checking_imports=True, cache_dir=None)
    loops = cycles(graph)
    if not loops:
        print(f"No import cycle between the {len(graph.modules)} modules.")
        return 0
    print(f"{len(loops)} import cycle(s) between modules; move code so that imports point one way:")
    for loop in loops:
        print(f"- {' -> '.join(loop)}")
        print("\n".join(describe(graph, loop)))
    return 1


if __name__ == "__main__":
    sys.exit(main())
