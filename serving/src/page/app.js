// Tessera's cluster page: plain JS over the front door's JSON API
// (/api/cluster, /api/models, /api/live/stream) and its KServe v2 and
// OpenAI endpoints. No build step, no library, no network beyond this
// server. Everything the server sends is put in the page as text, never
// as HTML.
"use strict";

const SVG = "http://www.w3.org/2000/svg";
const PALETTE = ["#8dd3c7", "#fdb462", "#bebada", "#fb8072", "#80b1d3", "#b3de69", "#fccde5", "#ffffb3"];
const TOKEN_KEY = "tessera-token";
const state = { models: [], model: null, pictureKey: "", polling: [], streaming: null, deviceColors: {} };

// ---- helpers ---------------------------------------------------------

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v);
  }
  for (const c of children) node.append(c instanceof Node ? c : String(c));
  return node;
}

function svg(tag, attrs, ...children) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  for (const c of children) node.append(c instanceof Node ? c : String(c));
  return node;
}

function bytes(n) {
  if (!n) return "0 B";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return (i ? n.toFixed(1) : n) + " " + units[i];
}

function micros(us) {
  if (!us) return "–";
  return us >= 1000 ? (us / 1000).toFixed(2) + " ms" : us.toFixed(0) + " µs";
}

function plural(n, one, many) {
  return n + " " + (n === 1 ? one : (many || one + "s"));
}

function colorOf(device) {
  if (!(device in state.deviceColors)) {
    state.deviceColors[device] = PALETTE[Object.keys(state.deviceColors).length % PALETTE.length];
  }
  return state.deviceColors[device];
}

function headers(extra) {
  const h = Object.assign({}, extra || {});
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) h.Authorization = "Bearer " + token;
  return h;
}

class Unauthorized extends Error {}

async function api(path, options) {
  const opts = Object.assign({}, options || {});
  opts.headers = headers(opts.headers);
  const response = await fetch(path, opts);
  if (response.status === 401) throw new Unauthorized("401");
  const body = await response.json().catch(() => ({}));
  if (!response.ok) throw new Error(body.error && (body.error.message || body.error) || response.statusText);
  return body;
}

// Reads a server-sent event stream from a fetch response: calls onEvent
// with (event name, data) for each.
async function readEvents(response, onEvent) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      let name = "message";
      const data = [];
      for (const line of block.split("\n")) {
        if (line.startsWith("event:")) name = line.slice(6).trim();
        else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
      }
      if (data.length) onEvent(name, data.join("\n"));
    }
  }
}

function setStatus(text) {
  document.getElementById("status").textContent = text;
}

// ---- login -------------------------------------------------------------

function askForToken(message) {
  stopAll();
  document.getElementById("views").hidden = true;
  document.getElementById("login").hidden = false;
  document.getElementById("login-error").textContent = message || "";
}

document.getElementById("login-form").addEventListener("submit", (e) => {
  e.preventDefault();
  sessionStorage.setItem(TOKEN_KEY, document.getElementById("token").value);
  start();
});

function guard(promise) {
  return promise.catch((e) => {
    if (e instanceof Unauthorized) {
      const had = sessionStorage.getItem(TOKEN_KEY);
      sessionStorage.removeItem(TOKEN_KEY);
      askForToken(had ? "That token is not accepted." : "");
    } else {
      setStatus(String(e.message || e));
    }
  });
}

// ---- views -------------------------------------------------------------

function showView(name) {
  for (const v of document.querySelectorAll(".view")) v.hidden = v.id !== "view-" + name;
  for (const a of document.querySelectorAll("nav a")) a.classList.toggle("active", a.dataset.view === name);
}

window.addEventListener("hashchange", () => showView(location.hash.slice(1) || "cluster"));

// ---- cluster -----------------------------------------------------------

function memoryBar(memory) {
  const total = Math.max(memory.offered, memory.stages + memory.state, 1);
  const pct = (v) => (100 * v / total).toFixed(2) + "%";
  return el("div", { class: "bar", title: "stages " + bytes(memory.stages) + ", state " + bytes(memory.state) + " of " + bytes(memory.offered) },
    el("div", { class: "stages", style: "width:" + pct(memory.stages) }),
    el("div", { class: "state", style: "width:" + pct(memory.state) }));
}

function workerCard(w) {
  const devices = w.devices.map((d) => el("div", { class: "device", "data-device": d.device },
    el("div", {}, el("b", {}, d.device), " ", el("span", { class: "muted" }, d.full_name)),
    memoryBar(d.memory),
    el("div", { class: "muted" },
      "stages " + bytes(d.memory.stages) + " · state " + bytes(d.memory.state) + " · offered " +
      (d.memory.offered ? bytes(d.memory.offered) : "unlimited"))));
  const age = w.state === "lost" ? "lost " + (w.heartbeat_age_ms / 1000).toFixed(1) + " s ago"
    : "heartbeat " + w.heartbeat_age_ms + " ms ago";
  return el("div", { class: "card worker " + w.state, "data-worker": w.name, "data-state": w.state },
    el("h3", {}, w.name, el("span", { class: "badge " + w.state }, w.state)),
    el("div", { class: "muted" }, w.data_addr + " · " + age),
    el("div", {}, "running " + w.running + " · rtt " + micros(w.rtt_us) + " · rss " + bytes(w.rss_bytes) +
      " · networks " + (w.networks.length ? w.networks.map((n) => "#" + n).join(", ") : "none")),
    ...devices);
}

async function refreshCluster() {
  const doc = await api("/api/cluster");
  const coordinators = doc.coordinators.map((c) => c.addr + (c.leading ? " (leading)" : " (standby)"));
  document.getElementById("coordinators").textContent =
    "coordinators: " + (coordinators.join(", ") || "one") + " · " + plural(doc.workers.length, "worker") + " · " +
    plural(doc.networks, "network") + " · " + plural(doc.in_flight, "run") + " under way";
  const cards = doc.workers.map(workerCard);
  if (cards.length === 0) cards.push(el("p", { class: "muted" }, "No worker has registered."));
  cards.push(el("div", { class: "legend muted" }, "memory:", el("span", { style: "background:#80b1d3" }), "stages",
    el("span", { style: "background:#fdb462" }), "sequence state", el("span", { style: "background:#eef0f3" }), "free"));
  document.getElementById("workers").replaceChildren(...cards);
  setStatus("updated " + new Date().toLocaleTimeString());
}

// ---- models and the picture ----------------------------------------------

function fillSelect(select, names) {
  const current = select.value;
  const same = [...select.options].map((o) => o.value).join("\n") === names.join("\n");
  if (!same) select.replaceChildren(...names.map((n) => el("option", { value: n }, n)));
  if (names.includes(current)) select.value = current;
}

async function refreshModels() {
  const doc = await api("/api/models");
  state.models = doc.models;
  fillSelect(document.getElementById("model-select"), doc.models.map((m) => m.name));
  fillSelect(document.getElementById("play-model"), doc.models.filter((m) => m.state === "READY").map((m) => m.name));
  drawModel();
  showPlayground(false);
}

function selectedModel() {
  const name = document.getElementById("model-select").value;
  return state.models.find((m) => m.name === name);
}

// Pipeline order: a subgraph's column is one more than its inputs' deepest.
function levels(subgraphs) {
  const level = {};
  const byId = Object.fromEntries(subgraphs.map((s) => [s.id, s]));
  const visit = (s) => {
    if (s.id in level) return level[s.id];
    level[s.id] = 0;
    const deps = s.depends_on.map((d) => byId[d]).filter(Boolean);
    level[s.id] = deps.length ? 1 + Math.max(...deps.map(visit)) : 0;
    return level[s.id];
  };
  subgraphs.forEach(visit);
  return level;
}

function edgeBytes(from, to) {
  return to.inputs.filter((i) => from.outputs.includes(i.name)).reduce((sum, i) => sum + i.bytes, 0);
}

function drawModel() {
  const model = selectedModel();
  const summary = document.getElementById("model-summary");
  const picture = document.getElementById("model-picture");
  if (!model) { picture.replaceChildren(); summary.textContent = "No model is loaded."; return; }
  summary.textContent = model.state + (model.reason ? " (" + model.reason + ")" : "") + " · network " + model.network +
    (model.plan ? " · " + plural(model.plan.subgraphs.length, "subgraph") + " · " + plural(model.plan.copies.length, "copy", "copies") + " · predicted " +
      model.plan.predicted_rps.toFixed(1) + " requests/s" : "");
  const key = JSON.stringify([model.name, model.network, model.plan && model.plan.copies.map((c) => [c.deployment, c.devices]),
    model.plan && model.plan.copies.map((c) => c.us_per_run)]);
  if (key === state.pictureKey) return;
  state.pictureKey = key;
  if (!model.plan) { picture.replaceChildren(el("p", { class: "muted" }, "Not deployed.")); return; }
  const started = performance.now();
  picture.replaceChildren(planSvg(model));
  picture.dataset.drawMs = (performance.now() - started).toFixed(1);
}

function planSvg(model) {
  const plan = model.plan;
  const level = levels(plan.subgraphs);
  const columns = Math.max(0, ...Object.values(level)) + 1;
  const perColumn = {};
  const slot = {};
  for (const s of plan.subgraphs) {
    const l = level[s.id];
    slot[s.id] = perColumn[l] = (perColumn[l] || 0) + 1;
  }
  const rows = Math.max(1, ...Object.values(perColumn));
  const W = 190, H = 78, GX = 70, GY = 16, LANE_GAP = 34, X0 = 200;
  const laneHeight = rows * (H + GY) + LANE_GAP;
  const width = X0 + columns * (W + GX);
  const height = plan.copies.length * laneHeight + 10;
  const root = svg("svg", { width, height, viewBox: `0 0 ${width} ${height}`, "data-model": model.name });
  root.append(svg("defs", {}, svg("marker", { id: "arrow", viewBox: "0 0 10 10", refX: 10, refY: 5, markerWidth: 7, markerHeight: 7, orient: "auto-start-reverse" },
    svg("path", { d: "M 0 0 L 10 5 L 0 10 z", fill: "#555" }))));
  const byId = Object.fromEntries(plan.subgraphs.map((s) => [s.id, s]));
  plan.copies.forEach((copy, c) => {
    const top = c * laneHeight + 10;
    const pos = (s) => ({ x: X0 + level[s.id] * (W + GX), y: top + (slot[s.id] - 1) * (H + GY) });
    root.append(svg("text", { x: 8, y: top + 14, "font-weight": "bold" }, "copy " + (c + 1)));
    root.append(svg("text", { x: 8, y: top + 30 }, copy.hosts.join(", ")));
    const lane = svg("g", { class: "copy", "data-copy": c + 1 });
    for (const s of plan.subgraphs) {
      const to = pos(s);
      const deps = s.depends_on.map((d) => byId[d]).filter(Boolean);
      const external = s.inputs.filter((i) => !deps.some((d) => d.outputs.includes(i.name)));
      for (const d of deps) lane.append(arrow(pos(d), to, W, H, edgeBytes(d, s)));
      if (external.length) {
        const b = external.reduce((sum, i) => sum + i.bytes, 0);
        lane.append(arrow(null, to, W, H, b, true));
      }
    }
    plan.subgraphs.forEach((s, i) => lane.append(subgraphBox(model, s, copy, i, pos(s), W, H)));
    root.append(lane);
  });
  return root;
}

function arrow(from, to, W, H, b, fromInputs) {
  const x1 = fromInputs ? X0_INPUT : from.x + W, y1 = fromInputs ? to.y + H / 2 : from.y + H / 2;
  const x2 = to.x, y2 = to.y + H / 2;
  const g = svg("g", { class: "edge" });
  g.append(svg("line", { x1, y1, x2, y2, stroke: "#555", "marker-end": "url(#arrow)" }));
  g.append(svg("text", { x: (x1 + x2) / 2 - 20, y: (y1 + y2) / 2 - 4, fill: "#333" }, bytes(b)));
  return g;
}
const X0_INPUT = 120;

function subgraphBox(model, s, copy, index, p, W, H) {
  const device = copy.devices[index] || s.device;
  const host = device.includes("/") ? device.split("/")[0] : (s.host || "");
  const runs = copy.runs[index] || 0, per = copy.us_per_run[index] || 0;
  const g = svg("g", { class: "subgraph", "data-id": s.id, "data-host": host, "data-device": device,
    transform: `translate(${p.x},${p.y})` });
  g.addEventListener("click", () => guard(openSubgraph(model.name, s.id)));
  g.append(svg("title", {}, s.op_counts.slice(0, 6).map(([op, n]) => op + " ×" + n).join(", ")));
  g.append(svg("rect", { width: W, height: H, rx: 5, fill: colorOf(device), stroke: "#666" }));
  g.append(svg("text", { x: 8, y: 16, "font-weight": "bold" }, "#" + s.id + "  " + device));
  g.append(svg("text", { x: 8, y: 32 }, s.nodes + " nodes" + (s.fell_back ? " · " + s.fell_back + " fell back" : "")));
  g.append(svg("text", { x: 8, y: 48 }, "weights " + bytes(s.memory.weights) + (s.memory.state ? " · state " + bytes(s.memory.state) : "")));
  g.append(svg("text", { x: 8, y: 64 }, runs ? micros(per) + "/run · " + runs + " runs" : "predicted " + micros(s.predicted_compute_us)));
  return g;
}

async function openSubgraph(name, id) {
  const doc = await api("/api/models/" + encodeURIComponent(name) + "/subgraphs/" + id);
  const rows = doc.nodes.map((n) => el("tr", {},
    el("td", {}, n.name), el("td", {}, n.op_type),
    el("td", {}, n.supported_on.join(", ") || "none"),
    el("td", {}, n.decision ? n.decision.rule + (n.decision.rank !== undefined ? " (rank " + n.decision.rank + ")" : "") : "")));
  document.getElementById("subgraph-detail").replaceChildren(
    el("h3", {}, "Subgraph " + doc.id + " on " + doc.device + " · " + doc.nodes.length + " nodes"),
    el("p", { class: "muted" }, "measured per copy: " + doc.us_per_run.map((u, i) => micros(u) + "/run over " + doc.runs[i] + " runs").join("; ")),
    el("p", { class: "muted" }, "inputs: " + doc.inputs.map((i) => i.name + " (" + bytes(i.bytes) + ")").join(", ") +
      " · outputs: " + doc.outputs.join(", ")),
    el("table", { id: "subgraph-nodes" },
      el("thead", {}, el("tr", {}, el("th", {}, "node"), el("th", {}, "op type"), el("th", {}, "supported on (QueryNetwork)"), el("th", {}, "placed by"))),
      el("tbody", {}, ...rows)));
}

// ---- live --------------------------------------------------------------

function sparkline(values, color) {
  const w = 150, h = 28;
  const max = Math.max(1e-9, ...values);
  const points = values.map((v, i) => `${(i * w / Math.max(1, values.length - 1)).toFixed(1)},${(h - 2 - v / max * (h - 4)).toFixed(1)}`);
  return svg("svg", { width: w, height: h, class: "sparkline" },
    svg("polyline", { points: points.join(" "), fill: "none", stroke: color, "stroke-width": 1.5 }));
}

function cell(value, history, color, id) {
  const attrs = { class: "num", "data-value": value };
  if (id) attrs.id = id;
  return el("td", attrs, String(value), history ? sparkline(history, color) : "");
}

function renderLive(doc) {
  const rows = doc.models.map((m) => el("tr", { "data-model": m.name },
    el("td", {}, m.name),
    cell(m.cluster.requests_per_s.toFixed(1), m.history.cluster_requests_per_s, "#2563eb", "live-rps-" + m.name),
    cell(m.requests_per_s, m.history.requests_per_s, "#0891b2"),
    cell(m.p50_ms, m.history.p50_ms, "#16a34a"),
    cell(m.p99_ms, m.history.p99_ms, "#ca8a04"),
    cell(m.tokens_per_s, m.history.tokens_per_s, "#9333ea"),
    cell(m.cluster.queued, m.history.queued, "#64748b"),
    cell(m.cluster.sequences + (m.cluster.waiting ? " (+" + m.cluster.waiting + " waiting)" : "")),
    cell(m.errors_per_s, m.history.errors_per_s, "#dc2626")));
  document.querySelector("#live-table tbody").replaceChildren(...rows);
}

async function streamLive() {
  const controller = new AbortController();
  state.streaming = controller;
  const response = await fetch("/api/live/stream", { headers: headers(), signal: controller.signal });
  if (response.status === 401) throw new Unauthorized("401");
  await readEvents(response, (name, data) => { if (name === "live") renderLive(JSON.parse(data)); });
}

function keepStreaming() {
  streamLive().catch((e) => {
    if (e instanceof Unauthorized) return guard(Promise.reject(e));
    if (state.streaming && !state.streaming.signal.aborted) setTimeout(keepStreaming, 1000);
  });
}

// ---- playground ------------------------------------------------------------

function playModel() {
  const name = document.getElementById("play-model").value;
  return state.models.find((m) => m.name === name);
}

function showPlayground(force) {
  const m = playModel();
  const key = m ? m.name + ":" + m.network : "";
  if (!force && key === state.playKey) return;
  state.playKey = key;
  document.getElementById("play-generate").hidden = !(m && m.generative);
  document.getElementById("play-infer").hidden = !(m && !m.generative);
  if (!m || m.generative) return;
  const dim = (t, d, i) => d >= 0 ? el("span", {}, d + " ") :
    el("input", { type: "number", min: 1, value: i === 0 ? 1 : 64, "data-input": t.name, "data-dim": i });
  const row = (kind, t) => el("tr", {}, el("td", {}, kind), el("td", {}, t.name), el("td", {}, t.datatype),
    el("td", {}, ...(kind === "input" ? t.shape.map((d, i) => dim(t, d, i)) : [JSON.stringify(t.shape)])));
  document.getElementById("play-signature").replaceChildren(
    el("tr", {}, el("th", {}, ""), el("th", {}, "name"), el("th", {}, "datatype"), el("th", {}, "shape")),
    ...m.inputs.map((t) => row("input", t)), ...m.outputs.map((t) => row("output", t)));
}

function randomData(datatype, count) {
  const data = new Array(count);
  for (let i = 0; i < count; i++) {
    if (datatype.startsWith("FP")) data[i] = Math.random();
    else if (datatype === "BOOL") data[i] = Math.random() < 0.5;
    else if (datatype === "BYTES") data[i] = "tessera";
    else data[i] = Math.floor(Math.random() * 10);
  }
  return data;
}

async function runRandom() {
  const m = playModel();
  const inputs = m.inputs.map((t) => {
    const shape = t.shape.map((d, i) => {
      if (d >= 0) return d;
      const box = document.querySelector(`input[data-input="${CSS.escape(t.name)}"][data-dim="${i}"]`);
      return Math.max(1, parseInt(box && box.value, 10) || 1);
    });
    const count = shape.reduce((a, b) => a * b, 1);
    return { name: t.name, datatype: t.datatype, shape, data: randomData(t.datatype, count) };
  });
  const out = document.getElementById("play-outputs");
  out.textContent = "running…";
  const started = performance.now();
  const answer = await api("/v2/models/" + encodeURIComponent(m.name) + "/infer", {
    method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify({ inputs }),
  });
  const ms = (performance.now() - started).toFixed(1);
  out.textContent = answer.outputs.map((o) => o.name + "  " + o.datatype + " " + JSON.stringify(o.shape) +
    "\n  " + JSON.stringify(o.data.slice(0, 8)) + (o.data.length > 8 ? " …" : "")).join("\n") + "\n(" + ms + " ms)";
  out.dataset.done = "1";
}

async function generate() {
  const m = playModel();
  const text = document.getElementById("play-text");
  text.textContent = "";
  text.dataset.done = "";
  const body = {
    model: m.name,
    prompt: document.getElementById("prompt").value,
    max_tokens: parseInt(document.getElementById("max-tokens").value, 10) || 16,
    temperature: parseFloat(document.getElementById("temperature").value) || 0,
    stream: true,
  };
  const seed = document.getElementById("seed").value;
  if (seed !== "") body.seed = parseInt(seed, 10);
  const response = await fetch("/v1/completions", {
    method: "POST", headers: headers({ "Content-Type": "application/json" }), body: JSON.stringify(body),
  });
  if (response.status === 401) throw new Unauthorized("401");
  if (!response.ok) {
    const e = await response.json().catch(() => ({}));
    throw new Error((e.error && e.error.message) || response.statusText);
  }
  await readEvents(response, (_, data) => {
    if (data === "[DONE]") { text.dataset.done = "1"; return; }
    const chunk = JSON.parse(data);
    if (chunk.error) { text.dataset.error = chunk.error.message; return; }
    text.textContent += chunk.choices[0].text;
  });
}

// ---- start -------------------------------------------------------------------

function every(ms, f) {
  const run = () => guard(f());
  run();
  state.polling.push(setInterval(run, ms));
}

function stopAll() {
  state.polling.forEach(clearInterval);
  state.polling = [];
  if (state.streaming) state.streaming.abort();
  state.streaming = null;
}

async function start() {
  stopAll();
  try {
    await api("/api/cluster");
  } catch (e) {
    if (e instanceof Unauthorized) {
      const had = sessionStorage.getItem(TOKEN_KEY);
      sessionStorage.removeItem(TOKEN_KEY);
      return askForToken(had ? "That token is not accepted." : "");
    }
  }
  document.getElementById("login").hidden = true;
  document.getElementById("views").hidden = false;
  showView(location.hash.slice(1) || "cluster");
  every(500, refreshCluster);
  every(2000, refreshModels);
  keepStreaming();
}

document.getElementById("model-select").addEventListener("change", () => { state.pictureKey = ""; drawModel(); });
document.getElementById("play-model").addEventListener("change", () => showPlayground(true));
document.getElementById("play-infer-run").addEventListener("click", () => guard(runRandom()));
document.getElementById("play-generate-run").addEventListener("click", () => guard(generate()));
start();
