"""One BLAS thread per computing process: runtime.threads sets the variables, and each
process entry point calls it before anything can import numpy."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from runtime.threads import one_blas_thread_env, pin_one_blas_thread

ROOT = Path(__file__).resolve().parents[2]
#: the modules a computing process starts from (python -m ...)
ENTRY_POINTS = ["runtime/node.py", "runtime/calibrate.py", "runtime/serve/host.py", "splitroom/join_cmd.py"]


def test_the_pin_sets_one_thread_and_keeps_a_count_already_set(monkeypatch):
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "4")
    pin_one_blas_thread()
    import os
    assert [os.environ[n] for n in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")] == ["1", "4", "1"]


def test_a_childs_environment_gets_one_thread_whatever_it_said():
    env = {"PATH": "/bin", "OPENBLAS_NUM_THREADS": "8"}
    assert one_blas_thread_env(env) == {"PATH": "/bin", "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
                                        "MKL_NUM_THREADS": "1"}
    assert env == {"PATH": "/bin", "OPENBLAS_NUM_THREADS": "8"}


@pytest.mark.parametrize("path", ENTRY_POINTS)
def test_each_entry_point_pins_before_any_other_import(path):
    """The module's first statements (after its docstring) are ``from __future__``, the
    import of the pin and the call; every other import comes after the call."""
    body = ast.parse((ROOT / path).read_text()).body
    stmts = [s for s in body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    seen_call = False
    for s in stmts:
        if isinstance(s, ast.Expr) and isinstance(s.value, ast.Call) and getattr(s.value.func, "id", "") == \
                "pin_one_blas_thread":
            seen_call = True
            break
        if isinstance(s, ast.ImportFrom) and (s.module == "__future__" or (s.module or "").endswith("threads")):
            assert [a.name for a in s.names] in (["annotations"], ["pin_one_blas_thread"])
            continue
        pytest.fail(f"{path}: line {s.lineno} comes before pin_one_blas_thread()")
    assert seen_call, f"{path} never calls pin_one_blas_thread()"


def test_no_other_module_sets_the_blas_variables():
    """Only runtime/threads.py writes them (the numba kernels read them)."""
    writers = []
    for p in sorted(list((ROOT / "runtime").rglob("*.py")) + list((ROOT / "splitroom").rglob("*.py"))):
        text = p.read_text()
        if "MKL_NUM_THREADS" in text and p.name != "threads.py":
            writers.append(str(p.relative_to(ROOT)))
    assert writers == []
