"""The wgpu backend makes its adapter without printing errors that are not errors: a
process with no ``XDG_RUNTIME_DIR`` (a service, CI, a container) printed
``error: XDG_RUNTIME_DIR is invalid or not set in the environment.`` twice."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow


def test_making_the_adapter_without_xdg_runtime_dir_prints_no_error():
    env = {k: v for k, v in os.environ.items() if k != "XDG_RUNTIME_DIR"}
    r = subprocess.run([sys.executable, "-c", "from runtime.backends.wgpu_backend import get_device; "
                        "print(get_device()[0].summary)"], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "Vulkan" in r.stdout
    assert "XDG_RUNTIME_DIR" not in r.stderr and "error" not in r.stderr.lower(), r.stderr
