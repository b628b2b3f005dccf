"""A browser tab joins a room and holds layers 26-30: headless Debian chromium, its
SwiftShader WebGPU adapter on http://127.0.0.1 (``--enable-unsafe-webgpu``), opening
``share.html?layers=26-30&device=tab`` on the model host's API (``splitroom join --host
--layers 1-25 --peers tab --serve PORT``, numpy).

The tab speaks the room's wire from JavaScript (static/tab_worker.js): the relay's
signalling, three negotiated data channels, the framing, hello/plan/heartbeat/bye, and
residual frames; it takes its range's weights from the host over its weights data channel
(runtime/weights_share's requests, packed tensors unpacked in the tab), the manifest checked
against the sha256 the host's bundle gives and each tensor against the manifest, and runs
them with the wgpu backend's own WGSL kernels (runtime/serve/tab_stage.py generates them
with runtime/backends/wgsl.py). Over that channel the host refuses the tab a tensor or a
manifest outside its range; after the room is over, a manifest whose sha256 is not the
bundle's makes the tab's loading fail with the reason on its screen ("Room over").
The room's answer is token for token the single-process greedy answer. The device screen
(product page 001) is checked on both sides: the host's page says "Loading N%" for the tab
while it loads (its Progress messages), then each device's tokens handled (the prompt's
positions and one per decode lap, by hand), a tok/s and the ms per hop into it; the tab's
own panel shows its tokens handled and tok/s. ``/metrics`` has the hop time of both links
(host -> tab, tab -> host) from the two devices' stamps. Then the tab sends the host garbage
on every channel, bad stamps, heartbeats and progress among it, and the room answers
again, the same, its hops still counted. Then the host's process is killed: the tab says
"Host reconnecting" and keeps its layers, the host started again takes it back over a new
connection and the room answers the same once more. With ``SPLITROOM_SCREENSHOT=PATH`` the test saves
the tab's page as a PNG there (docs/room-tab-worker.png was taken so). The tab's screen
warns of a low battery and a refused wake lock (both faked before the page's scripts run) and,
while another tab is in front, of being in the background.

If chromium finds no WebGPU adapter the test fails with the tab's reason; it does not skip.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
import urllib.request

import pytest

from tests.integration.test_serve_room import MODEL, client, greedy  # noqa: F401
from tests.joinroom import SPLITROOM, relay_room

pytestmark = pytest.mark.slow

MAX_NEW = 3  # SwiftShader takes about 0.5-1 s per layer per step on a loaded 2-core machine
TAB_LAYERS = (25, 30)  # 26-30, 0-based half-open
#: the question; its empty system turn keeps the prompt at 18 positions (the template's default
#: system turn makes 37), and the tab's SwiftShader layers take each position of a prefill at
#: about the cost of a decode step, so the prompt's length is most of this test's time
CHAT = [{"role": "system", "content": ""}, {"role": "user", "content": "Capital of France?"}]

#: what the tab sends the host after its first answer (static/tab_worker.js sendRaw), as
#: JavaScript: [channel, bytes] pairs, bytes from a fixed-seed generator
GARBAGE_JS = """
let s = 0x9e3779b9;
const rnd = (n) => Uint8Array.from({ length: n }, () => { s = (s * 1103515245 + 12345) >>> 0; return s >>> 24; });
const cat = (...a) => { const o = new Uint8Array(a.reduce((n, x) => n + x.length, 0)); let i = 0;
  for (const x of a) { o.set(x, i); i += x.length; } return o; };
const u32 = (...v) => new Uint8Array(new Uint32Array(v).buffer);
const hdr = (kind, flags, q, lap, first, tokens, hidden, payload) =>
  cat(Uint8Array.from([0x53, 0x52, 0x46, 0x4d, 1, kind, 0, flags]), u32(q, lap, first, tokens, hidden, payload));
const nan = new Float32Array(576).fill(NaN);
const out = [];
for (const ch of ["residual", "reply", "weights"]) {
  for (let i = 0; i < 12; i++) out.push([ch, rnd(1 + (i * 37) % 300)]);           // random wire messages
  out.push([ch, cat(Uint8Array.from([1]), u32(7, 0, 0xffffffff), rnd(20))]);       // a piece announcing 4 GiB
  out.push([ch, cat(Uint8Array.from([1]), u32(8, 3, 100), rnd(20))]);              // a piece out of order
  out.push([ch, cat(Uint8Array.from([0]), rnd(40))]);                              // a whole message of noise
}
const whole = (b) => cat(Uint8Array.from([0]), b);
const enc = (t) => whole(new TextEncoder().encode(t));
out.push(["residual", whole(hdr(3, 1, 0, 0, 0, 1, 576, 2304))]);                  // a header, no payload
out.push(["residual", whole(hdr(3, 1, 0, 5, 0, 1, 575, 2300))]);                  // the wrong hidden size
out.push(["residual", whole(cat(hdr(3, 1, 0, 999999, 0, 1, 576, 2304), new Uint8Array(nan.buffer)))]);  // NaN
out.push(["residual", whole(cat(hdr(9, 1, 0, 1, 0, 1, 576, 2304), rnd(2304)))]);   // an unknown kind
out.push(["residual", whole(hdr(1, 0x3f, 0, 1, 0, 0, 576, 0))]);                  // unknown flags
for (const t of ["{", "[]", "null", '{"type":"plan","host":"tab","stages":[],"max_new_tokens":1}',
                 '{"type":"nope"}', '{"type":"hello","device":"' + "x".repeat(5000) + '"}',
                 '{"type":"fault","lap_id":-1,"device":"tab"}', '{"type":"fault","lap_id":424242,"device":"tab"}', '{"type":"ready","first_lap":123456}',
                 '{"type":"loading","first_lap":7}', '{"type":"bye"}',
                 '{"type":"stamps","arrived":[[1,"zz",1.0]],"sent":[[2,"tab",1.0]]}', '{"type":"stamps","sent":[[-1,"host",1]]}',
                 '{"type":"stamps","sent":[[4000000,"host",1e300]]}', '{"type":"progress","percent":500}',
                 '{"type":"progress","percent":-3}', '{"type":"heartbeat","sent_s":-5}',
                 '{"type":"heartbeat","sent_s":1,"echo_s":12345.5,"held_s":0}', '{"type":"heartbeat","sent_s":"NaN"}'])
  out.push(["reply", enc(t)]);
for (const t of ['Q\\x00\\x00\\x00\\x00', 'Q\\x05\\x00\\x00\\x00{"id"', '{"op":"tensor"}']) out.push(["weights", enc(t)]);
for (const [ch, b] of out) window.tabWorker.sendRaw("host", ch, b);
window.tabWorker.sendRaw("host", "reply", "a text message");
return out.length + 1;
"""


#: over the tab's weights channel while the room runs: its range's manifest (kept for
#: PROBE_JS), a tensor and a manifest outside its range (refused: the reasons)
WEIGHTS_JS = """
const done = arguments[arguments.length - 1], w = window.tabWorker;
(async () => {
  const out = {};
  window.manifestReply = await w.askWeights({ op: "manifest", start: w.bundle.start, end: w.bundle.end,
                                              embedding: false, head: false });
  out.manifest_sha = JSON.parse(new TextDecoder().decode(window.manifestReply[1])).sha256;
  for (const [k, req] of [["outside", { op: "tensor", name: "model.layers.3.mlp.down_proj.weight", offset: 0, length: 16 }],
                          ["wider", { op: "manifest", start: 0, end: 30, embedding: false, head: false }]]) {
    try { await w.askWeights(req); out[k] = "given"; } catch (e) { out[k] = e.message; }
  }
  done(out);
})().catch((e) => done({ error: String(e) }));
"""
#: after the room is over: a worker on the page's own screen loads with a bundle whose
#: manifest sha256 is not the one of the manifest the host sent (WEIGHTS_JS kept it)
PROBE_JS = """
const done = arguments[arguments.length - 1], w = window.tabWorker;
import("/tab_worker.js").then(async (m) => {
  const v = new m.TabWorker({ ...w.o, show: w.show });
  v.askWeights = async () => window.manifestReply;
  try { await v.loadWeights({ ...w.bundle, manifest_sha256: "0".repeat(64) }); } catch (e) { v.fail(e); }
  done([v.status, document.getElementById("tab-status").innerText,
        document.querySelector("#tab-screen .detail").innerText]);
}).catch((e) => done(["import failed", String(e)]));
"""

#: run before the page's scripts: the Battery Status API says 12 %, not charging, and the
#: Screen Wake Lock API refuses the lock (as a browser does for a page it does not allow)
DEVICE_JS = """
const battery = { level: 0.12, charging: false, addEventListener() {} };
Object.defineProperty(Navigator.prototype, "getBattery", { value: () => Promise.resolve(battery) });
Object.defineProperty(Navigator.prototype, "wakeLock", { get: () => ({
  request: () => Promise.reject(new DOMException("not allowed here", "NotAllowedError")) }) });
"""
#: the device screen's warnings (room.js), as the page words them
LOW = "Battery low: 12%, not charging"
SLEEP = "The screen can sleep: the wake lock was refused (NotAllowedError)"
BACKGROUND = "In the background: the browser slows this tab's timers; keep it in front"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _chromium():
    if not (shutil.which("chromium") and shutil.which("chromedriver")):
        pytest.skip("needs Debian's chromium and chromium-driver (scripts/setup.sh installs them)")
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service
    opts = Options()
    opts.binary_location = shutil.which("chromium")
    # the host's aiortc does not resolve mDNS .local names: the tab offers plain addresses
    for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--enable-unsafe-webgpu",
              "--use-webgpu-adapter=swiftshader", "--enable-features=Vulkan",
              "--disable-features=WebRtcHideLocalIpsWithMdns", "--window-size=1280,860"):
        opts.add_argument(a)
    drv = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=opts)
    drv.set_script_timeout(30)
    drv.set_page_load_timeout(60)
    return drv


def _tab(drv) -> dict:
    return drv.execute_script("const w = window.tabWorker; return w ? {status: w.status, over: !!w.over, "
                              "error: w.error, log: w.log.slice(-8), stats: w.stats, ms: w.ms} : null")


def _hop_counts(api: str) -> dict[tuple[str, str], float]:
    """``/metrics``' splitroom_hop_seconds count per (src, dst)."""
    from prometheus_client.parser import text_string_to_metric_families
    with urllib.request.urlopen(api + "/metrics", timeout=10) as r:
        text = r.read().decode()
    return {(x.labels["src"], x.labels["dst"]): x.value for f in text_string_to_metric_families(text)
            if f.name == "splitroom_hop_seconds" for x in f.samples if x.name == "splitroom_hop_seconds_count"}


def _cards(api: str) -> dict[str, dict]:
    with urllib.request.urlopen(api + "/api/room", timeout=10) as r:
        return {d["id"]: d for d in json.loads(r.read())["devices"]}


def _ask(api: str) -> tuple[str, int]:
    r = client(api, timeout_s=400).chat.completions.create(
        model=MODEL, messages=CHAT, max_tokens=MAX_NEW)
    return r.choices[0].message.content, r.usage.completion_tokens


def test_a_tab_joins_the_room_holds_layers_26_30_and_answers_like_one_process(greedy, tmp_path):  # noqa: F811
    want = greedy(CHAT, MAX_NEW)
    expected = greedy.tok.decode(want)
    drv = _chromium()
    logs = []
    try:
        with relay_room("tabroom") as (url, env, procs):
            port = _free_port()
            api = f"http://127.0.0.1:{port}"

            def start_host(name: str) -> subprocess.Popen:
                logs.append(open(tmp_path / name, "w"))
                p = subprocess.Popen(SPLITROOM + [
                    "join", url, "--device", "host", "--host", "--layers", "1-25", "--peers", "tab",
                    "--serve", str(port), "--timeout", "400", "--heartbeat-timeout", "60",
                    "--max-tokens", str(MAX_NEW)], env=env, stdout=logs[-1], stderr=subprocess.STDOUT, text=True)
                procs.append(p)
                end = time.monotonic() + 60
                while True:
                    try:
                        urllib.request.urlopen(api + "/health", timeout=5).close()
                        return p
                    except OSError as e:  # up or answering 503 "starting" (an HTTPError, an OSError) is enough
                        if getattr(e, "code", None):
                            return p
                        assert time.monotonic() < end and p.poll() is None, (tmp_path / name).read_text()
                        time.sleep(0.3)

            def until_models(p: subprocess.Popen, name: str) -> None:
                end = time.monotonic() + 120
                while not [m.id for m in client(api).models.list()]:
                    assert time.monotonic() < end and p.poll() is None, (tmp_path / name).read_text()[-3000:]
                    time.sleep(0.3)

            host = start_host("host.log")
            drv.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": DEVICE_JS})
            drv.get(api + f"/share.html?layers={TAB_LAYERS[0] + 1}-{TAB_LAYERS[1]}&device=tab")
            seen: list[str] = []
            host_saw: set[str] = set()  # what the host's page said of the tab meanwhile
            end = time.monotonic() + 300
            while time.monotonic() < end:
                st = _tab(drv)
                if st and (not seen or seen[-1] != st["status"]):
                    seen.append(st["status"])
                try:
                    host_saw.add(_cards(api).get("tab", {}).get("title", ""))
                except OSError:
                    pass
                if st and (st["over"] or st["status"].startswith("Serving")):
                    break
                assert host.poll() is None, (tmp_path / "host.log").read_text()[-3000:]
                time.sleep(0.2)
            # no adapter, a hash that does not match, a room it could not join: a failure with the reason
            assert st and st["status"].startswith("Serving · Layers 26-30 · "), (seen, st)
            assert any(s.startswith("Loading ") and s.endswith("%") for s in seen), seen
            assert any(re.fullmatch(r"Loading \d{1,3}%", t) for t in host_saw), host_saw
            until_models(host, "host.log")

            text, n = _ask(api)
            assert (text, n) == (expected, len(want)), _tab(drv)
            st = _tab(drv)
            assert st["stats"]["frames_out"] >= len(want) and st["stats"]["rejected"] == 0, st
            # the device screens: every position of the prompt once, then one per decode lap
            handled = len(greedy.tok.encode_chat(CHAT)) + len(want) - 1
            end = time.monotonic() + 30  # the tab's stamps come with its heartbeats (every 0.25 s)
            while time.monotonic() < end and not (_hop_counts(api).get(("tab", "host"), 0) >= len(want)
                                                  and _cards(api)["tab"]["hop_ms"] is not None):
                time.sleep(0.3)
            hops = _hop_counts(api)
            # every lap went host -> tab; each that returns (the last prefill chunk, each decode) came back
            assert hops.get(("tab", "host"), 0) == len(want) and hops.get(("host", "tab"), 0) >= len(want), hops
            cards = _cards(api)
            for dev, other in (("tab", "host"), ("host", "tab")):
                c = cards[dev]
                assert c["tokens_handled"] == handled and c["hop_from"] == [other], c
                assert c["hop_ms"] + c["hop_error_ms"] >= 0, c  # a hop is negative only within its clocks' bound
                assert c["tokens_per_s"] is None or c["tokens_per_s"] > 0, c  # None: under two passes in its window
            assert drv.execute_script("return window.tabWorker.stats.tokens") == handled
            stats = drv.execute_script("return document.getElementById('tab-stats').innerText")
            assert f"{handled} tokens handled" in stats and "tok/s" in stats, stats
            # the device screen's warnings: the battery and the refused wake lock; in the
            # background while another tab is in front, not once it is in front again
            mine = drv.current_window_handle
            assert drv.execute_script("return [...document.querySelectorAll('#tab-warn li')].map((e) => e.innerText)") \
                == [SLEEP, LOW]
            drv.switch_to.new_window("tab")
            time.sleep(0.5)
            drv.close()
            drv.switch_to.window(mine)
            assert drv.execute_script("return tabWarned") == [SLEEP, LOW, BACKGROUND]
            assert drv.execute_script("return [...document.querySelectorAll('#tab-warn li')].map((e) => e.innerText)") \
                == [SLEEP, LOW]
            if os.environ.get("SPLITROOM_SCREENSHOT"):
                time.sleep(2.5)  # the page's next snapshot (every 2 s) carries the tab's hop
                drv.save_screenshot(os.environ["SPLITROOM_SCREENSHOT"])

            # the weights channel: the range's manifest is the one the bundle pins; the host
            # refuses the tab anything outside its range
            with urllib.request.urlopen(api + f"/tab/bundle.json?layers={TAB_LAYERS[0] + 1}-{TAB_LAYERS[1]}"
                                        "&device=tab", timeout=30) as r:
                pinned = json.loads(r.read())["manifest_sha256"]
            got = drv.execute_async_script(WEIGHTS_JS)
            assert got == {"manifest_sha": pinned,
                           "outside": "host refused a weights request: does not hold tensor "
                                      "model.layers.3.mlp.down_proj.weight (granted to tab: layers [25, 30))",
                           "wider": got.get("wider")} and got["wider"].startswith(
                "host refused a weights request: does not hold layers [0, 30): "), got

            sent = drv.execute_script(GARBAGE_JS)
            assert sent > 50
            time.sleep(1.0)
            assert host.poll() is None, (tmp_path / "host.log").read_text()[-3000:]
            assert _ask(api) == (expected, len(want))  # the room still answers, the same
            end = time.monotonic() + 30
            while time.monotonic() < end and _hop_counts(api).get(("tab", "host"), 0) < 2 * len(want):
                time.sleep(0.3)
            assert _hop_counts(api).get(("tab", "host"), 0) == 2 * len(want)  # and its hops are still timed
            said = (tmp_path / "host.log").read_text()  # and the garbage did reach the host
            assert said.count("frame from tab rejected") >= 5 and said.count("dropped a piece from tab") >= 30
            assert said.count("control message from tab ignored") >= 5
            with urllib.request.urlopen(api + "/api/room", timeout=10) as r:
                screens = {d["id"]: d["title"] for d in json.loads(r.read())["devices"]}
            assert screens == {"host": "Serving", "tab": "Serving"}, screens

            # ms per layer of one position on the host's page, the tab's beside the Python host's:
            # the tab's from its own two stamps of each decode lap (its stage and any wait for it),
            # so its stage runs as the tab timed them fit inside; the numpy host's from its compute
            one = [ms for tokens, ms in _tab(drv)["ms"] if tokens == 1]
            assert len(one) == 2 * (len(want) - 1), one  # the decode laps of both answers
            cards = _cards(api)
            n_tab = TAB_LAYERS[1] - TAB_LAYERS[0]
            assert cards["tab"]["layer_ms"] * n_tab >= sum(one) / len(one) - 1e-3, (cards["tab"], one)
            assert cards["host"]["layer_ms"] > 0, cards["host"]
            print(f"\nms per layer of one position (the room page, {len(one)} decode laps): tab (SwiftShader "
                  f"WebGPU) {cards['tab']['layer_ms']:.1f}, numpy host {cards['host']['layer_ms']:.2f}")

            # the host's process is killed: the tab keeps its layers and waits for it ("Host
            # reconnecting"); the host started again connects to it through the relay, takes
            # its hello and gives it the plan, and the room answers the same
            host.kill()
            host.wait(timeout=10)
            end = time.monotonic() + 30
            while time.monotonic() < end and _tab(drv)["status"] != "Host reconnecting":
                time.sleep(0.2)
            st = _tab(drv)
            assert st["status"] == "Host reconnecting" and not st["over"], st
            frames_before = st["stats"]["frames_in"]
            host = start_host("host-again.log")
            until_models(host, "host-again.log")
            end = time.monotonic() + 30  # the new process's plan (sent before its node hears the tab)
            while time.monotonic() < end and not _tab(drv)["status"].startswith("Serving"):
                time.sleep(0.2)
            st = _tab(drv)
            assert st["status"].startswith("Serving · Layers 26-30 · ") and "host is back" in " ".join(st["log"]), st
            assert _ask(api) == (expected, len(want)), _tab(drv)
            assert _tab(drv)["stats"]["frames_in"] > frames_before
            host.send_signal(signal.SIGINT)
            assert host.wait(timeout=60) == 0
            end = time.monotonic() + 20
            while time.monotonic() < end and not _tab(drv)["over"]:
                time.sleep(0.2)
            st = _tab(drv)
            assert st["status"] == "Room over" and "the host is done" in " ".join(st["log"]), st
            shown = drv.execute_async_script(PROBE_JS)
            reason = (f"weights manifest sha256 {pinned[:12]}... is not the {'0' * 12}... the host's bundle "
                      "gives: these weights are not loaded")
            assert shown == ["Room over", "Room over", reason], shown
    finally:
        drv.quit()
        for f in logs:
            f.close()
