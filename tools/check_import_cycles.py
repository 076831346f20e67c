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


def strongly_connected(graph: grimp.ImportGraph) -> list[list[str]]:
    """The components of more than one module (Tarjan's algorithm, iterative: no recursion limit)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph.modules):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.find_modules_directly_imported_by(start))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            for succ in successors:
                if succ not in index:
                    index[succ] = low[succ] = len(index)
                    stack.append(succ)
                    on_stack.add(succ)
                    work.append((succ, iter(sorted(graph.find_modules_directly_imported_by(succ)))))
                    break
                if succ in on_stack:
                    low[node] = min(low[node], index[succ])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
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


def one_cycle(graph: grimp.ImportGraph, component: list[str]) -> list[str]:
    """A shortest loop through the component's first module, as the modules along it (first == last)."""
    first = component[0]
    members = set(component)
    best: tuple[str, ...] | None = None
    for succ in sorted(graph.find_modules_directly_imported_by(first) & members):
        back = graph.find_shortest_chain(importer=succ, imported=first)
        if back is not None and (best is None or len(back) < len(best)):
            best = back
    assert best is not None, component  # a strongly connected component has a loop through each member
    return [first, *best]


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
    components = strongly_connected(graph)
    if not components:
        print(f"No import cycle between the {len(graph.modules)} modules.")
        return 0
    print(f"{len(components)} import cycle(s) between modules; move code so that imports point one way:")
    for component in components:
        print(f"- {', '.join(component)}")
        print("\n".join(describe(graph, one_cycle(graph, component))))
    return 1


if __name__ == "__main__":
    sys.exit(main())
