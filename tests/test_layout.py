"""The layout's import rules, checked on the source (no module is run): each folder is one
concept and the dependencies run one way. See docs/design/layout.md."""

from __future__ import annotations

import ast
import os

import pytest

PACKAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "relax_tune")
MAX_LINES = 600


def _modules() -> dict[str, str]:
    """``{dotted module name: path}`` of every module of the package."""
    out = {}
    for root, _, files in os.walk(PACKAGE):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(root, name)
                rel = os.path.relpath(path, os.path.dirname(PACKAGE))[:-3].replace(os.sep, ".")
                out[rel.removesuffix(".__init__")] = path
    return out


def _imports(module: str, path: str) -> set[str]:
    """The absolute names of the modules ``module`` imports (relative imports resolved;
    imports inside functions and under TYPE_CHECKING included)."""
    with open(path, encoding="utf-8") as file:
        tree = ast.parse(file.read())
    package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            out.add(name)
            out.update(f"{name}.{alias.name}" for alias in node.names)
    return out


MODULES = _modules()


def _importers(prefix: str, of: str) -> list[str]:
    """Modules under ``prefix`` that import anything under ``of``."""
    return sorted(m for m, p in MODULES.items() if m == prefix or m.startswith(prefix + ".")
                  if any(i == of or i.startswith(of + ".") for i in _imports(m, p)))


@pytest.mark.parametrize("importer, imported, why", [
    ("relax_tune", "tvm.s_tir.meta_schedule", "the engine is ours; MetaSchedule is the competitor"),
    ("relax_tune.measure", "relax_tune.dynamic", "measurement knows no dynamic shapes"),
    ("relax_tune.tuning", "relax_tune.report", "the engine imports no presentation"),
    ("relax_tune.tuning", "relax_tune.cli", "the engine imports no presentation"),
    ("relax_tune.tuning.loop", "relax_tune.dynamic", "the loop knows no dynamic shapes"),
    ("relax_tune.database", "relax_tune.search", "a record's identity lives with the records"),
    ("relax_tune.database", "relax_tune.tuning", "the database is below the engine"),
    ("relax_tune.space", "relax_tune.search", "design spaces are below the search"),
    ("relax_tune.space", "relax_tune.tuning", "design spaces are below the engine"),
    ("relax_tune.lowering", "relax_tune.tuning", "lowering comes before tuning"),
    ("relax_tune.transfer", "relax_tune.tuning", "transfer is a source the engine consults"),
    ("relax_tune.transfer", "relax_tune.search", "the search gets transfers through its context"),
    ("relax_tune.search", "relax_tune.transfer", "the search gets transfers through its context"),
])
def test_dependencies_run_one_way(importer, imported, why):
    assert _importers(importer, imported) == [], why


def test_no_module_is_too_long():
    long = {m: n for m, p in MODULES.items()
            if (n := sum(1 for _ in open(p, encoding="utf-8"))) > MAX_LINES}
    assert long == {}, f"modules over {MAX_LINES} lines: split them by job"


def test_the_checks_see_the_imports():
    """The rule checks above would pass on an empty picture: they must see real imports."""
    assert _importers("relax_tune.tuning", "relax_tune.measure")
    assert _importers("relax_tune.transform", "relax_tune.dynamic")
    assert _importers("relax_tune.space.cpu", "relax_tune.space.analysis")
