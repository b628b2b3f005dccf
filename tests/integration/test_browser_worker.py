"""A browser tab holds layers 26-30 with WebGPU: headless Debian chromium, its SwiftShader
adapter on http://127.0.0.1 (``--enable-unsafe-webgpu``), running the wgpu backend's own
WGSL kernels (runtime/serve/tab_stage.py generates them with runtime/backends/wgsl.py;
static/tab_stage.js only binds and dispatches). A Python model host holding layers 1-25
(numpy) decodes greedily with the tab as its worker, and the answer is token for token
the single-process greedy answer; the tab's residual matches the numpy stage's.

What this does not cover: the tab is driven through WebDriver here, not over the room's
data channel and weights channel (the tab takes its weights over HTTP from this test's
server), so it is the tab's compute, not yet a tab joined to a room.
"""

from __future__ import annotations

import asyncio
import base64
import shutil
import threading
import time

import numpy as np
import pytest

from runtime.backends import StageSpec, make_stage
from runtime.config import ModelConfig
from runtime.generate import generate_greedy
from runtime.serve.tab_stage import make_app, stage_bundle, stage_weights
from runtime.tokenizer import ChatTokenizer
from runtime.weights import ensure_safetensors, load_range
from tests.joinroom import greedy_reference

pytestmark = pytest.mark.slow

PROMPT = "What is the capital of France?"
MAX_NEW = 5
TAB = (25, 30)  # layers 26-30, 0-based half-open


@pytest.fixture(scope="module")
def served_tab():
    """The tab stage's page on 127.0.0.1 (a free port), in a thread of its own."""
    from aiohttp import web
    model_dir = ensure_safetensors()
    cfg = ModelConfig.load(model_dir)
    bundle = stage_bundle(cfg, *TAB)
    weights = stage_weights(cfg, load_range(model_dir, *TAB, False, False), *TAB)
    loop = asyncio.new_event_loop()
    started = threading.Event()
    box = {}

    async def start():
        runner = web.AppRunner(make_app(bundle, weights), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        box["runner"], box["port"] = runner, runner.addresses[0][1]

    def main():
        asyncio.set_event_loop(loop)
        loop.run_until_complete(start())
        started.set()
        loop.run_forever()

    th = threading.Thread(target=main, daemon=True)
    th.start()
    assert started.wait(30)
    try:
        yield f"http://127.0.0.1:{box['port']}/tab.html"
    finally:
        asyncio.run_coroutine_threadsafe(box["runner"].cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        th.join(10)


@pytest.fixture(scope="module")
def tab(served_tab):
    if not (shutil.which("chromium") and shutil.which("chromedriver")):
        pytest.skip("needs Debian's chromium and chromium-driver (scripts/setup.sh installs them)")
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service
    opts = Options()
    opts.binary_location = shutil.which("chromium")
    for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--enable-unsafe-webgpu",
              "--use-webgpu-adapter=swiftshader", "--enable-features=Vulkan"):
        opts.add_argument(a)
    drv = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=opts)
    drv.set_script_timeout(120)
    try:
        drv.get(served_tab)
        end = time.monotonic() + 90
        while time.monotonic() < end:
            st = drv.execute_script("return window.tab ? [window.tab.ready, window.tab.error] : [false, null]")
            if st[0] or st[1]:
                break
            time.sleep(0.2)
        if not st[0]:  # no adapter is a failure with its reason, never a skip
            pytest.fail(f"the tab's WebGPU stage did not start: {st[1] or 'no answer in 90 s'}")
        yield drv
    finally:
        drv.quit()


class TabWorker:
    """A Stage-like worker (``forward(hidden, first_pos)``) whose layers run in the tab;
    ``ms`` collects the tab's own time per call (JS ``performance.now``), ``calls`` each
    call's input, position and output."""

    def __init__(self, drv):
        self.drv = drv
        self.ms: list[tuple[int, float]] = []
        self.calls: list[tuple[np.ndarray, int, np.ndarray]] = []

    def forward(self, hidden: np.ndarray, first_pos: int) -> np.ndarray:
        x = np.ascontiguousarray(hidden, np.float32)
        out, ms = self.drv.execute_async_script("""
            const [b64, n, pos, done] = arguments;
            const raw = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
            const t0 = performance.now();
            window.tab.stage.forward(new Float32Array(raw.buffer), n, pos).then((y) => {
              const ms = performance.now() - t0;
              const u8 = new Uint8Array(y.buffer); let s = "";
              for (let i = 0; i < u8.length; i += 0x8000) s += String.fromCharCode.apply(null, u8.subarray(i, i + 0x8000));
              done([btoa(s), ms]);
            }, (e) => done(["error: " + e, 0]));""", base64.b64encode(x.tobytes()).decode(), x.shape[0], first_pos)
        assert not out.startswith("error"), out
        self.ms.append((x.shape[0], ms))
        y = np.frombuffer(base64.b64decode(out), np.float32).reshape(x.shape).copy()
        self.calls.append((x, first_pos, y))
        return y


def test_a_tab_holding_layers_26_30_answers_like_one_process(tab):
    model_dir = ensure_safetensors()
    tok = ChatTokenizer.from_dir(model_dir)
    want = greedy_reference(PROMPT, MAX_NEW)
    host = make_stage("numpy", model_dir, StageSpec(0, TAB[0], host=True))
    worker = TabWorker(tab)
    got = generate_greedy([host, worker], tok.encode_chat(PROMPT), MAX_NEW, stop_ids=tok.stop_ids).ids
    assert [t for t in got if t not in tok.stop_ids] == want
    # the tab's residuals are the numpy stage's, call by call, to float32 rounding
    ref = make_stage("numpy", model_dir, StageSpec(*TAB))
    numpy_ms = []
    for x, pos, y in worker.calls:
        t0 = time.perf_counter()
        r = ref.forward(x, pos)
        numpy_ms.append((x.shape[0], (time.perf_counter() - t0) * 1e3))
        assert np.max(np.abs(y - r)) <= 1e-3 * max(1.0, float(np.max(np.abs(r)))), pos

    def per_layer(ms: list) -> float:
        one = sorted(m for n, m in ms if n == 1)
        return one[len(one) // 2] / (TAB[1] - TAB[0]) if one else float("nan")
    print(f"\nms per layer per decode step (median of {len(numpy_ms) - 1}): tab (WebGPU, "
          f"{tab.execute_script('return window.tab.stage.adapterInfo')}) {per_layer(worker.ms):.2f}, "
          f"numpy worker {per_layer(numpy_ms):.2f}")
