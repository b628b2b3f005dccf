"""Each device process's wgpu adapter chosen by index: SPLITROOM_WGPU_ADAPTER in one process,
SPLITROOM_WGPU_ADAPTERS for a real room's processes (one index each, in the deal's order)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from splitroom.real_errors import RealRunError
from splitroom.real_procs import adapter_indices


def test_room_indices_follow_device_order(monkeypatch):
    monkeypatch.setenv("SPLITROOM_WGPU_ADAPTERS", "3, 1,0")
    assert adapter_indices(["a", "b", "c"]) == {"a": 3, "b": 1, "c": 0}
    assert adapter_indices(["a"]) == {"a": 3}
    monkeypatch.delenv("SPLITROOM_WGPU_ADAPTERS")
    assert adapter_indices(["a", "b"]) == {}


@pytest.mark.parametrize("raw, why", [("0,x", "must be adapter indices"), ("0", "names 1 adapters for 2 device processes"),
                                      ("-1,0", "must be adapter indices")])
def test_room_indices_refused_in_one_line(monkeypatch, raw, why):
    monkeypatch.setenv("SPLITROOM_WGPU_ADAPTERS", raw)
    with pytest.raises(RealRunError, match=why) as e:
        adapter_indices(["a", "b"])
    assert "\n" not in str(e.value)


def test_process_index_parsed_and_checked(monkeypatch):
    wb = pytest.importorskip("runtime.backends.wgpu_backend")
    monkeypatch.setenv("SPLITROOM_WGPU_ADAPTER", "2")
    assert wb.adapter_index() == 2
    monkeypatch.setenv("SPLITROOM_WGPU_ADAPTER", "")
    assert wb.adapter_index() is None
    monkeypatch.setenv("SPLITROOM_WGPU_ADAPTER", "gpu1")
    with pytest.raises(wb.WgpuUnavailable, match="must be an adapter index"):
        wb.adapter_index()


def test_index_past_the_adapters_is_one_line():
    pytest.importorskip("wgpu")
    code = ("from runtime.backends import wgpu_backend as w\n"
            "n = len(w.list_adapters())\n"
            "import os; os.environ['SPLITROOM_WGPU_ADAPTER'] = str(n)\n"
            "try:\n    w.get_device()\nexcept w.WgpuUnavailable as e:\n    print('REFUSED', n, e)\n"
            "os.environ['SPLITROOM_WGPU_ADAPTER'] = '0'\nprint('CHOSEN', w.get_device()[0].summary == w.list_adapters()[0])\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith(("REFUSED", "CHOSEN"))]
    if not lines or lines[0].split()[1] == "0":
        pytest.skip("no Vulkan adapter here")
    assert lines[0].startswith("REFUSED") and "adapters: 0: " in lines[0]
    assert lines[1] == "CHOSEN True"
