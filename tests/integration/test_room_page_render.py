"""What the room page draws from a known snapshot, in a real browser (Debian's chromium,
headless, through the system chromedriver): the real RoomServer and its page on a
loopback port, with a stand-in for the host's node (tests/unit/test_serve_health.py's),
so no model loads and the page is up in a second or two."""

from __future__ import annotations

import asyncio
import shutil
import threading
import time

import pytest
from aiohttp import web

from runtime.serve.server import RoomServer
from tests.unit.test_serve_health import INFO, fake_node

pytestmark = pytest.mark.slow

CHROMIUM = shutil.which("chromium")
DRIVER = shutil.which("chromedriver")


@pytest.fixture(scope="module")
def browser():
    if not (CHROMIUM and DRIVER):
        pytest.skip("needs Debian's chromium and chromium-driver (scripts/setup.sh installs them as root)")
    from tests.integration.test_serve_browser import _chrome
    drv = _chrome()
    try:
        yield drv
    finally:
        drv.quit()


class PageServer:
    """``srv.app`` served on 127.0.0.1 (a free port) from a thread's own event loop."""

    def __init__(self, srv: RoomServer):
        self.srv, self.loop = srv, asyncio.new_event_loop()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        asyncio.set_event_loop(self.loop)
        self.runner = web.AppRunner(self.srv.app, shutdown_timeout=1.0)  # the page's event stream stays open
        self.loop.run_until_complete(self.runner.setup())
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        self.loop.run_until_complete(site.start())
        self.port = site._server.sockets[0].getsockname()[1]
        self.ready.set()
        self.loop.run_forever()

    def __enter__(self):
        self.thread.start()
        assert self.ready.wait(10)
        return f"http://127.0.0.1:{self.port}/"

    def call(self, fn):
        """Run ``fn()`` on the server's loop (the page's state is the loop's)."""
        done = threading.Event()
        self.loop.call_soon_threadsafe(lambda: (fn(), done.set()))
        assert done.wait(5)

    def __exit__(self, *exc):
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def _wait_text(drv, element_id: str, want, timeout_s: float = 10.0) -> str:
    """The text of ``#element_id`` once ``want(text)`` holds (or the last seen, on timeout)."""
    from selenium.webdriver.common.by import By
    end, text = time.monotonic() + timeout_s, ""
    while time.monotonic() < end:
        text = drv.find_element(By.ID, element_id).text
        if want(text):
            break
        time.sleep(0.1)
    return text


def test_an_unpredicted_room_says_so_instead_of_a_dash(browser):
    # join --serve's room info: no scenario, so no prediction and nothing measured yet
    info = {**INFO, "devices": [{"id": "a", "lends_bytes": None}, {"id": "b", "lends_bytes": None}],
            "shares": [], "notes": [], "predicted_tokens_per_s": None}
    srv = RoomServer("m", info)
    srv.attach(fake_node([("a", 0, 15), ("b", 15, 30)]))
    with PageServer(srv) as url:
        browser.get(url)
        text = _wait_text(browser, "deal", lambda t: "layers 16-30" in t)
        assert "layers 16-30" in text
        speed = browser.find_element("css selector", ".speed").text
        assert "not predicted" in speed and "no answer measured yet" in speed, speed
        assert "- tok/s" not in speed and "-tok/s" not in speed, speed
    info["predicted_tokens_per_s"] = 12.345  # a room with a scenario: the prediction, one decimal
    srv = RoomServer("m", info)
    srv.attach(fake_node([("a", 0, 15), ("b", 15, 30)]))
    srv.last_tokens_per_s = 7.04
    with PageServer(srv) as url:
        browser.get(url)
        speed = _wait_text(browser, "predicted", lambda t: "12.3" in t)
        assert "predicted for the scenario's devices 12.3 tok/s" in browser.find_element("css selector", ".speed").text
        assert "measured here, last answer 7.0 tok/s" in browser.find_element("css selector", ".speed").text


def test_nineteen_api_clients_are_one_chip_and_leave_the_page_when_gone(browser):
    from runtime.serve import page as page_mod
    now = [100.0]
    srv = RoomServer("m", {**INFO, "devices": [{"id": "a", "lends_bytes": 10**9}, {"id": "b", "lends_bytes": 10**9}],
                           "shares": [], "notes": []}, clock=lambda: now[0])
    srv.attach(fake_node([("a", 0, 15), ("b", 15, 30)]))
    for i in range(19):
        srv.page.client_seen(f"api:key-{i:016x}")
    with PageServer(srv) as url:
        browser.get(url)
        _wait_text(browser, "chips", lambda t: "API client" in t)
        chips = browser.execute_script(
            "return Array.from(document.querySelectorAll('#chips .chip.client'), (c) => c.textContent)")
        assert chips == ["19 API clientsno layers"], chips
        now[0] += page_mod.CLIENT_SHOWN_S + 1  # nobody asked since: the next snapshot (2 s) has no chip
        text = _wait_text(browser, "chips", lambda t: "API client" not in t, timeout_s=8.0)
        assert "API client" not in text and "a" in text, text


def test_each_device_screen_shows_its_own_time_not_the_room_wide_speed(browser):
    from planner.frames import FrameHeader, FrameKind
    from planner.protocol import Computed, FrameArrived, SendFrame
    now = [0.0]
    srv = RoomServer("m", {**INFO, "devices": [{"id": "a"}, {"id": "b"}], "shares": [], "notes": []},
                     clock=lambda: now[0])
    srv.attach(fake_node([("a", 0, 15), ("b", 15, 30)]))
    srv.phase, srv.last_tokens_per_s = "serving", 41.0
    srv._observe(Computed("a", "RunStage", 1, 0.004))  # the host: 4 ms, out, 25 ms away, back
    srv._observe(SendFrame("a", "b", FrameHeader(FrameKind.DECODE, 1, 1, 1, 1, 576)))
    now[0] += 0.025
    srv._observe(FrameArrived("a", "b", FrameHeader(FrameKind.RESULT, 1, 1, 1, 1, 576)))
    from planner.hops import HopTimed
    srv._observe(HopTimed("a", "b", 1, 0.012, 0.0005))  # of those 25 ms, 12 were the hop out (the stamps)
    from planner.hops import StageTimed
    srv._observe(StageTimed("b", 1, 0.0105))  # and 10.5 the lap at b (its two stamps): 0.7 ms for each of 15 layers
    with PageServer(srv) as url:
        browser.get(url)
        _wait_text(browser, "screens", lambda t: "ms" in t)
        a, b = browser.execute_script(  # both at once: each snapshot redraws the screens
            "return ['screen-a', 'screen-b'].map((i) => document.getElementById(i).textContent)")
        assert "4.0 ms per stage" in a and "25.0 ms per round (hop out, its layers, hop back)" in b, (a, b)
        assert "12.0 ms per hop from a (clocks within 0.5 ms)" in b and "no hop timed yet" in a, (a, b)
        assert "1 tokens handled" in a and "1 tokens handled" in b, (a, b)
        assert "0.3 ms per layer" in a and "0.7 ms per layer" in b, (a, b)  # 4 ms / 15 layers, 10.5 ms / 15
        # one pass: no rate of its own yet; the room's 41.0 tok/s is not a device's
        assert "- tok/s" in a and "- tok/s" in b and "41.0" not in a + b, (a, b)
