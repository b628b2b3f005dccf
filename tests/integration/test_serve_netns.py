"""`splitroom serve` with the emulated network (one namespace per device, the scenario's
round trip on their packets): the API still listens on this machine's 127.0.0.1 (the
socket is bound outside the namespaces and handed to the host), answers right, and
Ctrl-C removes the namespaces it made."""

from __future__ import annotations

import subprocess

import pytest

from runtime import netem
from tests.integration.test_serve_room import FRANCE, MODEL, Served, client, greedy  # noqa: F401

pytestmark = pytest.mark.slow


def _namespaces() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=10).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


@pytest.mark.skipif(not netem.available(probe=False)[0], reason="no network emulation here (needs root and ip)")
def test_served_room_in_namespaces_answers_on_loopback_and_cleans_up(greedy):  # noqa: F811
    before = _namespaces()
    srv = Served([])
    try:
        srv.wait_ready()
        assert any("network namespaces" in line for line in srv.log), srv.log
        made = _namespaces() - before
        assert len(made) >= 4  # three devices and the bridge
        r = client(srv.url).chat.completions.create(model=MODEL, messages=[{"role": "user", "content": FRANCE}],
                                                    max_tokens=8)
        assert r.choices[0].message.content == greedy.tok.decode(greedy(FRANCE)[:8])
    finally:
        code = srv.stop()
    assert code == 0
    assert not (made & _namespaces())
