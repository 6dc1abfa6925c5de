"""Project rules that a test can check: the engine is ours."""

import pathlib
import re

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "relax_tune"


def test_package_never_imports_metaschedule():
    pattern = re.compile(r"(from|import)\s+tvm\.s_tir\.meta_schedule|"
                         r"from\s+tvm\.s_tir\s+import\s+.*meta_schedule|"
                         r"s_tir\.meta_schedule\.")
    sources = list(PACKAGE.rglob("*.py"))
    assert sources
    offenders = [str(p) for p in sources if pattern.search(p.read_text())]
    assert offenders == []
