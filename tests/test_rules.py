"""Project rules that a test can check: the engine is ours."""

import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "relax_tune"


def _competitor_uses(path: pathlib.Path) -> list[str]:
    """Imports of tvm.s_tir.meta_schedule, and calls of its FFI functions, in one file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if "meta_schedule" in a.name]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""] + [a.name for a in node.names]
            found += [n for n in names if "meta_schedule" in n]
        elif isinstance(node, ast.Attribute) and node.attr == "meta_schedule":
            found.append(ast.unparse(node))
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            arg = node.args[0].value
            if isinstance(arg, str) and arg.startswith(("meta_schedule.", "s_tir.meta_schedule.")):
                found.append(arg)
    return [f"{path.name}: {f}" for f in found]


def test_package_never_uses_metaschedule():
    sources = list(PACKAGE.rglob("*.py"))
    assert len(sources) > 10
    assert [u for p in sources for u in _competitor_uses(p)] == []


def test_the_check_catches_an_import(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("from tvm.s_tir import meta_schedule as ms\n"
                   "f = tvm.get_global_func('s_tir.meta_schedule.Foo')\n")
    assert len(_competitor_uses(bad)) == 2
