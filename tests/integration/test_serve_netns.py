"""`splitroom serve` with the emulated network (one namespace per device, the scenario's
round trip on their packets): the API still listens on this machine's 127.0.0.1 (the
socket is bound outside the namespaces and handed to the host), answers right, and
Ctrl-C removes the namespaces it made."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from runtime.testbed import netem
from tests.integration.test_serve_room import FRANCE, MODEL, Served, client, greedy  # noqa: F401

pytestmark = pytest.mark.slow


def _namespaces() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=10).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def _descends_from(pid: int, ancestor: int) -> bool:
    """Whether process ``pid`` is ``ancestor`` or one of its descendants (/proc's parent links)."""
    for _ in range(64):
        if pid == ancestor:
            return True
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return False
        if pid <= 1:
            return False
    return False


def _owned_by(served_pid: int) -> set[str]:
    """The namespaces of the emulated networks whose owner is the served process or its child:
    each live run's state file names its owner and namespaces (runtime.testbed.netem.STATE_DIR). Another
    room on this machine (a `run --real` beside the suite) makes and removes its own meanwhile,
    so "what appeared since the start" is not this room's."""
    out: set[str] = set()
    for f in netem.STATE_DIR.glob("*.json") if netem.STATE_DIR.is_dir() else []:
        try:
            st = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        if _descends_from(int(st.get("pid", -1)), served_pid):
            out |= set(st.get("namespaces", []))
    return out


@pytest.mark.skipif(not netem.available(probe=False)[0], reason="no network emulation here (needs root and ip)")
def test_served_room_in_namespaces_answers_on_loopback_and_cleans_up(greedy):  # noqa: F811
    srv = Served([])
    try:
        srv.wait_ready()
        assert any("network namespaces" in line for line in srv.log), srv.log
        made = _owned_by(srv.proc.pid)
        assert len(made) >= 4, made  # three devices and the bridge
        assert made <= _namespaces(), made
        r = client(srv.url).chat.completions.create(model=MODEL, messages=[{"role": "user", "content": FRANCE}],
                                                    max_tokens=8)
        assert r.choices[0].message.content == greedy.tok.decode(greedy(FRANCE)[:8])
    finally:
        code = srv.stop()
    assert code == 0
    assert not (made & _namespaces())
