"""The import graph has floors and no circles (grimp builds the graph from the sources).

Floors, who may import whom: app -> engine -> {npu, shaders, resources}; npu, shaders and
resources import none of app/engine and not each other; nothing in the product imports tests,
bench or tools (those three sit above everything). No two modules anywhere import each other,
directly or round a longer circle, function-level imports included. Imports made only for
annotations (under ``if TYPE_CHECKING:``) never run, so they do not count: a type may name
the class that uses it.
"""

from __future__ import annotations

import grimp
import pytest

# The package names, in one place: the product installs under phoenix_chat. (pyproject.toml)
PREFIX = "phoenix_chat."
DEV = ("tests", "bench", "tools")  # never imported by the product; not installed
PRODUCT_FLOORS = (("app",), ("engine",), ("npu", "shaders", "resources"))  # top floor first


def _name(pkg: str) -> str:
    return pkg if pkg in DEV else PREFIX + pkg


@pytest.fixture(scope="module")
def graph():
    packages = [_name(p) for p in DEV + sum(PRODUCT_FLOORS, ())]
    return grimp.build_graph(*packages, cache_dir=None, exclude_type_checking_imports=True)


def _floors() -> list[grimp.Layer]:
    return [grimp.Layer(*(_name(p) for p in DEV), independent=False)] + [
        grimp.Layer(*(_name(p) for p in floor), independent=True) for floor in PRODUCT_FLOORS
    ]


def _explain(dep) -> str:
    routes = "; ".join(" -> ".join([*sorted(r.heads)[:1], *r.middle, *sorted(r.tails)[:1]]) for r in dep.routes)
    return f"{dep.importer} imports {dep.imported} ({routes})"


def test_floors(graph):
    illegal = graph.find_illegal_dependencies_for_layers(layers=_floors())
    assert not illegal, "imports against the floors:\n" + "\n".join(sorted(map(_explain, illegal)))


def test_no_import_cycles(graph):
    """Every package's children (each with its descendants) import each other one way only."""
    circles = {}
    for pkg in sorted(m for m in graph.modules if graph.find_children(m)):
        breakers = graph.nominate_cycle_breakers(pkg)
        if breakers:
            circles[pkg] = sorted(f"{a} -> {b}" for a, b in breakers)
    assert not circles, "import cycles (break one of these imports in each):\n" + "\n".join(
        f"{pkg}: {', '.join(edges)}" for pkg, edges in circles.items()
    )
