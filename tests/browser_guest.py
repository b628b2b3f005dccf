"""Ask one question as a browser guest: ``python -m tests.browser_guest URL QUESTION TIMEOUT_S``.

Starts Debian's headless chromium through the system chromedriver (selenium), opens
``URL`` (a room's ``/share.html``), waits until the page knows the room's guest desk,
asks ``QUESTION`` in the chat box and prints one JSON line: ``{"answer": text,
"ice_servers": the page's RTCIceServer urls}``, or ``{"error": ...}``. Run inside a
network namespace (``ip netns exec``) it is a guest on that namespace's network: its
chromedriver and browser talk over that namespace's own loopback.
"""

from __future__ import annotations

import json
import shutil
import sys
import time


def main(url: str, question: str, timeout_s: float) -> int:
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    opts = Options()
    opts.binary_location = shutil.which("chromium") or "chromium"
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,860"):
        opts.add_argument(a)
    drv = webdriver.Chrome(service=Service(shutil.which("chromedriver") or "chromedriver"), options=opts)
    end = time.monotonic() + timeout_s
    try:
        drv.set_page_load_timeout(max(5.0, timeout_s))
        while True:  # the host may not serve yet
            try:
                drv.get(url)
                break
            except Exception as e:
                if time.monotonic() > end:
                    print(json.dumps({"error": f"page did not load: {type(e).__name__}"}))
                    return 1
                time.sleep(1.0)
        while not drv.execute_script("return !!(typeof state !== 'undefined' && state && state.guest && "
                                     "state.ready === true)"):
            if time.monotonic() > end:
                print(json.dumps({"error": "the page never learned the room's guest desk"}))
                return 1
            time.sleep(0.3)
        ice = drv.execute_script("return (state.guest.ice_servers || []).map(s => s.urls)")
        drv.find_element(By.ID, "question").send_keys(question)
        drv.find_element(By.ID, "send").click()
        answer = ""
        while time.monotonic() < end:
            answer = drv.execute_script(
                "const a = document.querySelectorAll('#log .a'); return a.length ? a[a.length - 1].textContent : ''")
            if answer and drv.execute_script("return !document.getElementById('send').disabled"):
                break
            time.sleep(0.2)
        print(json.dumps({"answer": answer, "ice_servers": ice}))
        return 0
    finally:
        drv.quit()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], float(sys.argv[3])))
