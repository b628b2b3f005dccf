"""The room page in a real browser: Debian's chromium, headless, driven by selenium
through the system chromedriver (no browser download). The page shows the devices
loading and then serving as the room starts, and its chat box streams the same answer
text `splitroom generate` gives."""

from __future__ import annotations

import json
import shutil
import time

import pytest

from tests.integration.test_serve_room import FRANCE, Served, _get, greedy  # noqa: F401

pytestmark = pytest.mark.slow

CHROMIUM = shutil.which("chromium")
DRIVER = shutil.which("chromedriver")


@pytest.fixture(scope="module")
def browser():
    if not (CHROMIUM and DRIVER):
        pytest.skip("needs Debian's chromium and chromium-driver (scripts/setup.sh installs them as root)")
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service
    opts = Options()
    opts.binary_location = CHROMIUM
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,860"):
        opts.add_argument(a)
    drv = webdriver.Chrome(service=Service(DRIVER), options=opts)
    drv.set_page_load_timeout(90)
    drv.set_script_timeout(30)
    try:
        yield drv
    finally:
        drv.quit()


def _titles(drv) -> dict:
    return drv.execute_script(
        "const o = {}; for (const s of document.querySelectorAll('.screen')) "
        "o[s.id.slice(7)] = s.querySelector('.title').textContent; return o;")


def test_the_page_shows_the_room_start_and_answers_in_the_browser(browser, greedy, tmp_path):  # noqa: F811
    from selenium.webdriver.common.by import By
    expected = greedy.tok.decode(greedy(FRANCE))
    srv = Served(["--loopback"])
    try:
        browser.get(srv.url + "/")
        seen: list[dict] = []
        end = time.monotonic() + 100
        while time.monotonic() < end:
            t = _titles(browser)
            if t and (not seen or seen[-1] != t):
                seen.append(t)
            if t and {k: v for k, v in t.items() if v != "Serving"} == {}:
                break
            time.sleep(0.2)
        assert seen and set(seen[-1].values()) == {"Serving"}, seen
        assert any("Loading" in s.values() for s in seen), seen  # the page watched the room start
        chips = browser.find_elements(By.CSS_SELECTOR, "#chips .chip:not(.client)")
        assert len(chips) == 3 and "Desktop" in chips[0].text
        chips[0].click()
        assert "Desktop" in browser.find_element(By.ID, "card").text
        browser.find_element(By.ID, "question").send_keys(FRANCE)
        browser.find_element(By.ID, "send").click()
        end = time.monotonic() + 90
        answer = ""
        while time.monotonic() < end:
            answer = browser.execute_script(
                "const a = document.querySelectorAll('#log .a'); return a.length ? a[a.length - 1].textContent : ''")
            done = browser.execute_script("return !document.getElementById('send').disabled")
            if answer and done:
                break
            time.sleep(0.2)
        assert answer == expected
        browser.save_screenshot(str(tmp_path / "room.png"))
        assert (tmp_path / "room.png").stat().st_size > 10_000
        assert "API client" in browser.find_element(By.ID, "chips").text  # the page itself asked
    finally:
        srv.stop()


def _chrome(extra: tuple[str, ...] = ()):
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service
    opts = Options()
    opts.binary_location = CHROMIUM
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
              "--window-size=1280,860", *extra):
        opts.add_argument(a)
    drv = webdriver.Chrome(service=Service(DRIVER), options=opts)
    drv.set_page_load_timeout(90)
    drv.set_script_timeout(30)
    return drv


def _ask_in_page(drv, question: str, timeout_s: float = 90.0) -> str:
    from selenium.webdriver.common.by import By
    drv.find_element(By.ID, "question").send_keys(question)
    drv.find_element(By.ID, "send").click()
    end = time.monotonic() + timeout_s
    answer = ""
    while time.monotonic() < end:
        answer = drv.execute_script(
            "const a = document.querySelectorAll('#log .a'); return a.length ? a[a.length - 1].textContent : ''")
        if answer and drv.execute_script("return !document.getElementById('send').disabled"):
            return answer
        time.sleep(0.2)
    return answer


@pytest.mark.skipif(not (CHROMIUM and DRIVER), reason="needs Debian's chromium and chromium-driver")
def test_a_browser_guest_asks_over_webrtc_with_and_without_mdns_hiding(greedy):  # noqa: F811
    """share.html: the question and the answer travel over the browser's own
    RTCPeerConnection to the host's aiortc (signalled through the relay), once with
    chromium's default of hiding host candidates behind mDNS .local names, once with
    the hiding turned off."""
    expected = greedy.tok.decode(greedy(FRANCE))
    srv = Served(["--loopback"])
    try:
        srv.wait_ready()
        assert json.loads(_get(srv.url + "/api/room"))["guest"]["desk"].endswith(".desk")
        for extra in ((), ("--disable-features=WebRtcHideLocalIpsWithMdns",)):
            drv = _chrome(extra)
            try:
                drv.get(srv.url + "/share.html")
                end = time.monotonic() + 30
                while time.monotonic() < end and not drv.execute_script("return !!(state && state.guest)"):
                    time.sleep(0.2)
                answer = _ask_in_page(drv, FRANCE)
                assert answer == expected, (extra, answer)
                kinds = [c["kind"] for c in json.loads(_get(srv.url + "/api/room"))["clients"]]
                assert "guest" in kinds  # asked as a guest, not through the HTTP API
            finally:
                drv.quit()
    finally:
        srv.stop()
