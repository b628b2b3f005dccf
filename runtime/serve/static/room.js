// The room page: chips, device screens, the deal, live updates (server-sent events
// from /api/events) and a chat box posting to /v1/chat/completions. No libraries.
"use strict";
const $ = (id) => document.getElementById(id);
// Icons drawn inline (no emoji font is needed, nothing is fetched).
const SVG = {
  computer: '<rect x="3" y="4" width="14" height="9" rx="1"/><path d="M1 15h18"/>',
  phone: '<rect x="6" y="2" width="8" height="16" rx="2"/><path d="M9 15h2"/>',
  client: '<path d="M7 2v5M13 2v5M5 7h10v3a5 5 0 0 1-10 0zM10 15v4"/>',
};
function icon(kind) {
  const span = document.createElement("span");
  span.className = "icon";
  span.innerHTML = '<svg viewBox="0 0 20 20" width="16" height="16" fill="none" stroke="currentColor" ' +
    'stroke-width="1.6" stroke-linecap="round" aria-hidden="true">' + (SVG[kind] || SVG.computer) + "</svg>";
  return span;
}
let state = null;
let openCard = null;

function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v; else if (k === "onclick") e.onclick = v; else e.setAttribute(k, v);
  }
  for (const k of kids) e.append(k instanceof Node ? k : document.createTextNode(String(k)));
  return e;
}

function fmt(x, digits) { return x === null || x === undefined ? "-" : Number(x).toFixed(digits); }
// "LEAD 12.3 tok/s" when the figure is known, else the sentence saying why not (never a bare dash)
function known(x, lead, otherwise) {
  if (x === null || x === undefined) return [otherwise];
  return [lead, el("b", {}, Number(x).toFixed(1)), " tok/s"];
}

function render(s) {
  state = s;
  $("room-name").textContent = (s.name || "") + " · " + s.model;
  const chips = $("chips");
  chips.replaceChildren();
  for (const d of s.devices) {
    chips.append(el("span", { class: "chip", id: "chip-" + d.id, onclick: () => showCard(d.id) },
      el("span", { class: "dot " + d.status, id: "dot-" + d.id }), icon(d.kind), d.name,
      el("span", { class: "mem" }, d.lends)));
  }
  for (const c of s.clients) {  // one chip per kind of client, with how many there are
    chips.append(el("span", { class: "chip client", id: "clients-" + c.kind, onclick: () => showClient(c) },
      el("span", { class: "dot idle" }), icon(c.kind === "guest" ? "phone" : "client"),
      clientName(c), el("span", { class: "mem" }, "no layers")));
  }
  const screens = $("screens");
  screens.replaceChildren();
  for (const d of s.devices) {
    const stats = el("div", { class: "stats" });
    if (d.status === "serving") {
      // this device's own figures (page.py's module doc says what each one is)
      stats.append(el("span", { class: "dot serving", id: "hop-" + d.id, title: "flashes when a pass reaches it" }),
        el("span", { class: "rate" }, d.tokens_per_s === null || d.tokens_per_s === undefined ? "- tok/s"
                                      : fmt(d.tokens_per_s, 1) + " tok/s"),
        el("span", { class: "handled" }, d.tokens_handled + " tokens handled"),
        el("span", { class: "hop" }, hopTime(d)), el("span", { class: "own" }, ownTime(d)),
        el("span", { class: "layer" }, layerTime(d)));
    }
    screens.append(el("div", { class: "screen", id: "screen-" + d.id },
      el("h3", {}, icon(d.kind), " " + d.name + " · " + d.role),
      el("div", { class: "title" }, d.title), el("div", { class: "detail" }, d.detail || ""), stats));
  }
  const st = $("status");
  st.className = "panel " + (s.ready ? "ready" : "wait");
  const answering = s.queue.in_flight_limit > 1 ? `answering ${s.queue.in_flight} of ${s.queue.in_flight_limit} at once`
                                               : (s.queue.answering ? "answering" : "idle");
  st.textContent = s.ready ? `Ready · ${answering} · ${s.queue.waiting} waiting`
                           : "Not ready: " + (s.reason || s.phase);
  const deal = $("deal");
  deal.replaceChildren(...s.deal.stages.map((x) =>
    el("li", {}, `${x.device}${x.device === s.host ? " (model host)" : ""}: layers ${x.layers}`)));
  $("notes").replaceChildren(...s.deal.notes.map((n) => el("li", {}, n)));
  $("predicted").replaceChildren(...known(s.predicted_tokens_per_s, "predicted for the scenario's devices ",
    "not predicted (no scenario models these devices)"));
  $("measured").replaceChildren(...known(s.measured_tokens_per_s, "measured here, last answer ", "no answer measured yet"));
  if (openCard) showCard(openCard);
  tabStats();
}

function showCard(id) {
  const d = state.devices.find((x) => x.id === id);
  if (!d) return;
  openCard = id;
  const card = $("card");
  card.hidden = false;
  card.replaceChildren(el("h2", {}, icon(d.kind), ` ${d.name} (${d.id})`),
    el("div", {}, `${d.role} · lends ${d.lends} · ${d.layers ? "layers " + d.layers : "no layers"}`),
    el("div", {}, `${d.title}: ${d.detail || ""}`), el("div", { class: "notes" }, d.why || ""),
    el("button", { onclick: () => { openCard = null; card.hidden = true; } }, "Close"));
}

// the mean hop into this device (a frame from the sender's transport until it is here)
function hopTime(d) {
  if (d.hop_ms === null || d.hop_ms === undefined) return "no hop timed yet";
  return `${fmt(d.hop_ms, 1)} ms per hop from ${d.hop_from.join(", ")} (clocks within ${fmt(d.hop_error_ms, 1)} ms)`;
}

// ms per layer of one position: the host's compute, a worker's (a tab's too) time with the lap
function layerTime(d) {
  return d.layer_ms === null || d.layer_ms === undefined ? "no one-position lap timed yet" : fmt(d.layer_ms, 1) + " ms per layer";
}

function ownTime(d) {
  if (d.stage_ms !== null && d.stage_ms !== undefined) return fmt(d.stage_ms, 1) + " ms per stage (its layers and the head)";
  if (d.round_ms !== null && d.round_ms !== undefined) return fmt(d.round_ms, 1) + " ms per round (hop out, its layers, hop back)";
  if (d.shared_ms !== null && d.shared_ms !== undefined) {
    return `not timed alone: ${fmt(d.shared_ms, 1)} ms per lap for all ${d.shared_by} workers`;
  }
  return "no lap timed yet";
}

function clientName(c) {
  const one = c.kind === "guest" ? "Guest" : "API client";
  return c.count > 1 ? `${c.count} ${one}s` : one;
}

function showClient(c) {
  openCard = null;
  const card = $("card");
  card.hidden = false;
  card.replaceChildren(el("h2", {}, clientName(c) + (c.kind === "guest" ? " (browser, WebRTC)" : "")),
    el("div", {}, c.ids.join(", ")),
    el("div", {}, `no layers · ${c.questions} questions asked · not counted as devices`),
    el("button", { onclick: () => { card.hidden = true; } }, "Close"));
}

function flash(devices) {
  for (const id of devices) {
    for (const e of [$("dot-" + id), $("hop-" + id), tabWorker && tabWorker.o.device === id ? $("tab-hop") : null]) {
      if (!e) continue;
      e.classList.add("flash");
      setTimeout(() => e.classList.remove("flash"), 120);
    }
  }
}

function listen() {
  const es = new EventSource("/api/events");
  es.addEventListener("state", (ev) => render(JSON.parse(ev.data)));
  es.addEventListener("pass", (ev) => flash(JSON.parse(ev.data).devices));
  es.onerror = () => { $("status").textContent = "Host unreachable: reconnecting"; };
}

// A browser guest: the question goes over WebRTC (this browser's RTCPeerConnection to
// the model host's aiortc), signalled through the room's relay (SDP only). Used on
// /share.html and with ?guest=1; elsewhere the page posts to the HTTP API.
const GUEST = location.pathname.endsWith("share.html") || new URLSearchParams(location.search).has("guest");
let channel = null;

function withTimeout(p, ms, what) {
  return Promise.race([p, new Promise((_, no) => setTimeout(() => no(new Error(what + " timed out")), ms))]);
}

async function guestChannel() {
  if (channel && channel.readyState === "open") return channel;
  const g = state && state.guest;
  if (!g) throw new Error("this room takes no browser guests (serve it with --loopback on one machine)");
  const me = "guest-" + Array.from(crypto.getRandomValues(new Uint8Array(6)), (b) => b.toString(16).padStart(2, "0")).join("");
  const ws = new WebSocket(`${g.relay}/room/${g.room}`);
  await withTimeout(new Promise((ok, no) => { ws.onopen = ok; ws.onerror = () => no(new Error("relay unreachable")); }),
                    10000, "the relay");
  ws.send(JSON.stringify({ type: "hello", device: me }));
  // the room's STUN/TURN servers (none unless the room names some: no server is contacted)
  const pc = new RTCPeerConnection({ iceServers: g.ice_servers || [], iceTransportPolicy: g.relay_only ? "relay" : "all" });
  const ch = pc.createDataChannel("reply");
  await pc.setLocalDescription(await pc.createOffer());
  await withTimeout(new Promise((ok) => {
    if (pc.iceGatheringState === "complete") ok();
    pc.onicegatheringstatechange = () => { if (pc.iceGatheringState === "complete") ok(); };
  }), 10000, "gathering candidates");
  const answered = new Promise((ok) => {
    ws.onmessage = async (ev) => {
      const m = JSON.parse(ev.data);
      if (m.type === "signal" && m.from === g.desk && m.data.type === "answer") {
        await pc.setRemoteDescription({ type: "answer", sdp: m.data.sdp });
        ok();
      }
    };
  });
  ws.send(JSON.stringify({ type: "signal", to: g.desk, data: { type: "offer", sdp: pc.localDescription.sdp } }));
  await withTimeout(answered, 20000, "the host's answer");
  await withTimeout(new Promise((ok) => { if (ch.readyState === "open") ok(); ch.onopen = ok; }), 30000,
                    "the data channel");
  ws.close();  // the relay saw the SDP exchange and nothing after it
  channel = ch;
  return ch;
}

function onData(a, data) {  // one "data: ..." message of an answer; true at its end
  if (data === "[DONE]") return true;
  const obj = JSON.parse(data);
  if (obj.error) {
    a.className = "a err";
    a.textContent += `${obj.error.status || ""} ${obj.error.message}` +
                     (obj.error.retry_after ? ` (try again in ${obj.error.retry_after} s)` : "");
    return true;
  }
  const ch = obj.choices && obj.choices[0];
  if (ch && ch.delta && ch.delta.content) a.textContent += ch.delta.content;
  return false;
}

async function askGuest(question, a) {
  const ch = await guestChannel();
  await new Promise((ok, no) => {
    ch.onmessage = (ev) => {
      for (const part of String(ev.data).split("\n\n")) {
        const line = part.trim();
        if (line.startsWith("data: ") && onData(a, line.slice(6))) { ok(); return; }
      }
    };
    ch.onclose = () => no(new Error("the host closed the connection"));
    ch.send(JSON.stringify({ model: modelId, messages: [{ role: "user", content: question }] }));
  });
}

async function ask(question) {
  const log = $("log");
  log.append(el("div", { class: "q" }, "> " + question));
  const a = el("div", { class: "a" });
  log.append(a);
  $("send").disabled = true;
  try {
    if (GUEST) { await askGuest(question, a); return; }
    const r = await fetch("/v1/chat/completions", {
      method: "POST", headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ model: modelId, stream: true,
                             messages: [{ role: "user", content: question }] }) });
    if (!r.ok) {
      const body = await r.json().catch(() => ({}));
      const wait = r.headers.get("Retry-After");
      a.className = "a err";
      a.textContent = `${r.status}: ${(body.error && body.error.message) || r.statusText}` +
                      (wait ? ` (try again in ${wait} s)` : "");
      return;
    }
    const reader = r.body.getReader();
    const dec = new TextDecoder();
    let buf = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += dec.decode(value, { stream: true });
      let i;
      while ((i = buf.indexOf("\n\n")) >= 0) {
        const line = buf.slice(0, i).trim();
        buf = buf.slice(i + 2);
        if (!line.startsWith("data: ")) continue;
        if (onData(a, line.slice(6))) return;
      }
      log.scrollTop = log.scrollHeight;
    }
  } catch (e) {
    a.className = "a err";
    a.textContent += " [" + (e && e.message ? e.message : e) + "]";
  } finally {
    $("send").disabled = false;
  }
}

let modelId = "";
$("ask").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const q = $("question").value.trim();
  if (q) { $("question").value = ""; ask(q); }
});
// share.html?layers=A-B (1-based, inclusive): this tab also joins the room as a worker
// holding those layers on its GPU (tab_worker.js), its own screen above the chat.
const PARAMS = new URLSearchParams(location.search);
// Its own figures: a hop dot flashing at each pass, its tok/s and tokens handled (its
// own clock), the ms per hop into it (the host's, from every device's stamps).
let tabWorker = null;
function tabStats() {
  const w = tabWorker, box = $("tab-stats");
  if (!w || !box || !w.loaded) return;
  const me = state && state.devices.find((d) => d.id === w.o.device);
  const rate = w.tokensPerS();
  box.replaceChildren(el("span", { class: "dot serving", id: "tab-hop" }),
    el("span", { class: "rate" }, rate === null ? "- tok/s" : fmt(rate, 1) + " tok/s"),
    el("span", { class: "handled" }, w.stats.tokens + " tokens handled"),
    el("span", { class: "hop" }, me ? hopTime(me) : "no hop timed yet"));
}
// Product page 001: the device screen warns when this tab is in the background (the browser
// slows a hidden tab's timers, its heartbeats among them), when the screen can sleep (no
// screen wake lock held: the Screen Wake Lock API) and when the battery is low (at most
// LOW_BATTERY and not charging: the Battery Status API). Each warning said is kept in
// tabWarned, in order (the tests read it).
const LOW_BATTERY = 0.2;
const warn = { sleep: null, battery: null, lock: null };
const tabWarned = [];
function tabWarnings() {
  const now = [];
  if (document.visibilityState === "hidden") now.push("In the background: the browser slows this tab's timers; keep it in front");
  if (warn.sleep) now.push(warn.sleep);
  if (warn.battery) now.push(warn.battery);
  for (const w of now) if (!tabWarned.includes(w)) tabWarned.push(w);
  const box = $("tab-warn");
  if (box) box.replaceChildren(...now.map((w) => el("li", {}, w)));
}
async function holdScreen() {  // a screen wake lock while the tab serves; taken again when it is in front again
  if (warn.lock || document.visibilityState === "hidden") return;
  if (!navigator.wakeLock) { warn.sleep = "The screen can sleep: this browser gives no wake lock"; tabWarnings(); return; }
  try {
    warn.lock = await navigator.wakeLock.request("screen");
    warn.sleep = null;
    warn.lock.addEventListener("release", () => { warn.lock = null; });
  } catch (e) {
    warn.sleep = `The screen can sleep: the wake lock was refused (${e.name || e})`;
  }
  tabWarnings();
}
async function watchBattery() {
  if (!navigator.getBattery) return;  // nothing known, nothing said
  const b = await navigator.getBattery();
  const check = () => {
    warn.battery = b.level <= LOW_BATTERY && !b.charging ? `Battery low: ${Math.round(b.level * 100)}%, not charging` : null;
    tabWarnings();
  };
  for (const ev of ["levelchange", "chargingchange"]) b.addEventListener(ev, check);
  check();
}
function startTab(s) {
  const box = $("tab-screen");
  box.hidden = false;
  const show = (status, detail) => { box.replaceChildren(el("h2", {}, "This tab · worker"),
    el("div", { class: "title", id: "tab-status" }, status), el("div", { class: "detail" }, detail),
    el("div", { class: "stats", id: "tab-stats" }), el("ul", { class: "warn", id: "tab-warn" })); tabStats(); tabWarnings(); };
  document.addEventListener("visibilitychange", () => { tabWarnings(); holdScreen(); });
  holdScreen();
  watchBattery().catch(() => {});
  const onPass = (w) => { tabWorker = w; flash([w.o.device]); };  // a pass reached this tab
  const onStats = (w) => { tabWorker = w; tabStats(); };  // its layers ran: its figures now
  show("Standing by", "");
  import("/tab_worker.js").then((m) => m.joinFromPage(s, PARAMS, show, onPass, onStats).then((w) => { tabWorker = w; tabStats(); }))
    .catch((e) => show("Room over", String(e)));
}
fetch("/api/room").then((r) => r.json()).then((s) => {
  modelId = s.model_id; render(s); listen();
  if (PARAMS.has("layers")) startTab(s);
});
