"""Package boundaries (DESIGN.md, "Import rules"), checked on the source with ``ast``.

``lint-imports`` checks the same contracts in ``make test``; this test also catches
what an import graph does not show: calls to ``open()`` and dynamic imports in the
planner.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: The planner is pure: no simulator, runtime, IO-bound, clock or global-randomness modules.
PLANNER_FORBIDDEN = {"simpy", "wgpu", "aiortc", "asyncio", "time", "os", "io", "pathlib", "socket",
                     "random", "sim", "runtime", "splitroom", "importlib", "subprocess", "shutil",
                     "tempfile", "datetime"}


def imported_modules(path: Path) -> set[str]:
    """Top-level names of every module ``path`` imports (relative imports excluded)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module.split(".")[0])
    return out


def called_names(path: Path) -> set[str]:
    """Names of plain function calls in ``path`` (``open(...)``, ``__import__(...)``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    return {n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}


def sources(package: str) -> list[Path]:
    """Every ``.py`` file under ``package/``."""
    return sorted((ROOT / package).rglob("*.py"))


def test_planner_has_sources():
    assert any(p.name == "deal.py" for p in sources("planner"))


@pytest.mark.parametrize("path", sources("planner"), ids=lambda p: str(p.relative_to(ROOT)))
def test_planner_is_pure(path):
    bad = imported_modules(path) & PLANNER_FORBIDDEN
    assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"
    calls = called_names(path) & {"open", "__import__", "exec", "eval", "input", "print"}
    if path.relative_to(ROOT).as_posix() == "planner/fastdc.py":
        # the one exception: it compiles a dataclass __init__ from the class's own field
        # names, as the standard library's dataclasses does; no file, clock or outside input
        calls -= {"exec"}
    assert not calls, f"{path.relative_to(ROOT)} calls {sorted(calls)}"


@pytest.mark.parametrize("path", sources("sim"), ids=lambda p: str(p.relative_to(ROOT)))
def test_sim_never_imports_runtime(path):
    bad = imported_modules(path) & {"runtime", "splitroom", "wgpu", "aiortc"}
    assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"


@pytest.mark.parametrize("path", sources("runtime"), ids=lambda p: str(p.relative_to(ROOT)))
def test_runtime_never_imports_sim(path):
    bad = imported_modules(path) & {"sim", "splitroom", "simpy"}
    assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"


def test_checker_sees_forbidden_imports(tmp_path):
    """The checker itself: it must see each form of import and an open() call."""
    f = tmp_path / "probe.py"
    f.write_text("import os.path\nfrom time import monotonic\nimport numpy as np\n"
                 "from . import sibling\ndef f():\n    import socket\n    return open('x')\n")
    assert imported_modules(f) == {"os", "time", "numpy", "socket"}
    assert "open" in called_names(f)
