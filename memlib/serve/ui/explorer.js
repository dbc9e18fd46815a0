// memlib memory explorer: a static page over the service's JSON API (no build step).
// The token stays in this tab's sessionStorage and is only sent to this origin.
"use strict";

const KIND_COLORS = {
  turn: "#4c78a8", fact: "#f58518", entity: "#54a24b", event: "#e45756", concept: "#72b7b2",
  triplet: "#b279a2", reflection: "#ff9da6", segment: "#9d755d", session: "#bab0ac", clue: "#d6b32a",
};
// what each signal of a hit means (memlib/retrieve/: auto.py, baselines.py, gaama.py, memorai.py, magma.py,
// assomem.py, personalai.py); a strategy's own name is its final score
const SIGNALS = {
  auto: "the auto strategy's final score: the sum of the terms below, in standard deviations",
  maxsim: "idf-weighted MaxSim: each query token's best match among the turn's tokens (late interaction)",
  z_maxsim: "MaxSim as a z-score over the tenant's turns: how far above the average turn it matches",
  session_prior: "how well the turn's session as a whole matches (mean of its best turns' MaxSim), as a z-score",
  adjacent: "how well the turn's neighbours in its session match, as a z-score",
  assistant: "1 for an assistant's turn: pushed down, what the user said about themselves is the memory",
  named_participant: "1 when someone the question names speaks in the turn's session: lifted",
  session_lead: "1 for the best turn of its session: lifted, so the top ranks cover more sessions",
  graph: "personalized PageRank mass from the best turns over the memory graph",
  bm25: "BM25 keyword score",
  cosine: "cosine similarity of the question's and the node's embeddings",
  rrf: "reciprocal rank fusion of the keyword and the embedding ranking",
  bm25_rank: "rank in the keyword (BM25) ranking (0: not in it)",
  dense_rank: "rank in the embedding ranking (0: not in it)",
  gaama: "GAAMA score: 0.1 x PageRank + 1.0 x similarity",
  ppr: "personalized PageRank over typed edges, hubs damped",
  sim: "cosine similarity of the question and the node",
  memorai: "MemORAI score",
  dwpr: "dynamic weighted PageRank on the question's subgraph",
  cites_rank: "rank of the triplets citing the turn",
  magma: "MAGMA score",
  anchor: "an anchor found by the vector, keyword and time searches together (1)",
  assomem: "AssoMem score: relevance, importance and time fused",
  relevance: "similarity to the question through the session's clues",
  importance: "PageRank importance of the node in the tenant's memory",
  temporal: "how well the turn's time matches the time the question asks about",
  personalai: "PersonalAI score",
  astar_rank: "rank in the A* search over entities", water_rank: "rank in the WaterCircles search",
  beam_rank: "rank in the beam search",
};
const signalMeaning = (name) => SIGNALS[name] || (name.startsWith("intent_") ? `the question's intent, as MAGMA's router ` +
  `read it: ${name.slice(7)}` : name.startsWith("w_") ? `weight of ${name.slice(2)} in the fusion, learned for this ` +
  "kind of question" : "");
const $ = (id) => document.getElementById(id);
const state = { token: sessionStorage.getItem("memlib.token") || "", strategies: [], tenant: null };

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (key === "class") node.className = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (key === "style") setStyle(node, value);
    else node.setAttribute(key, value);
  }
  for (const child of children.flat()) {
    if (child !== null && child !== undefined) node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

// through the CSSOM: the page's Content-Security-Policy (style-src 'self') refuses style attributes
function setStyle(node, css) {
  for (const decl of css.split(";")) {
    const at = decl.indexOf(":");
    if (at > 0) node.style.setProperty(decl.slice(0, at).trim(), decl.slice(at + 1).trim());
  }
}

function svgEl(tag, attrs = {}, ...children) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, value);
  for (const child of children) node.append(child instanceof Node ? child : String(child));
  return node;
}

function showError(message) {
  const box = $("error");
  box.textContent = message || "";
  box.hidden = !message;
}

async function api(path, options = {}) {
  const headers = Object.assign({ Authorization: `Bearer ${state.token}` }, options.headers || {});
  const resp = await fetch(path, Object.assign({}, options, { headers }));
  const body = await resp.json().catch(() => ({}));
  if (!resp.ok) throw new Error(`${resp.status} ${body.error || ""}: ${body.reason || resp.statusText}`);
  return body;
}

const fmtDate = (iso) => (iso ? iso.slice(0, 16).replace("T", " ") : "date unknown");
const fmtNum = (x) => (Math.abs(x) >= 100 ? x.toFixed(0) : Math.abs(x) >= 1 ? x.toFixed(2) : x.toFixed(3));
const short = (text, n) => (text.length > n ? text.slice(0, n - 1) + "…" : text);

// -- connect ------------------------------------------------------------------------------
async function connect(event) {
  if (event && event.preventDefault) event.preventDefault();
  state.token = $("token").value.trim() || state.token;
  showError("");
  const attempt = (state.attempt = (state.attempt || 0) + 1);  // only the latest attempt updates the page
  try {
    const [health, tenants] = await Promise.all([fetch("/healthz").then((r) => r.json()), api("/v1/tenants")]);
    if (attempt !== state.attempt) return;
    sessionStorage.setItem("memlib.token", state.token);
    state.strategies = health.strategies;
    fillSelect($("tenant"), tenants.tenants);
    fillSelect($("strategy"), health.strategies, "auto");
    $("compare-pick").replaceChildren(...health.strategies.map((name) => el("label", {},
      el("input", Object.assign({ type: "checkbox", value: name },
        ["auto", "bm25", "dense", "magma"].includes(name) ? { checked: "" } : {})), " ", name)));
    $("status").textContent = `store ${tenants.version} · ${tenants.tenants.length} tenant(s)` +
      (state.token ? "" : " · open (no token needed)");
    $("ask").hidden = false;
    $("welcome").hidden = true;
  } catch (err) {
    if (attempt !== state.attempt) return;
    $("status").textContent = "not connected";
    $("welcome").hidden = false;
    if (event !== "quietly") showError(`Could not connect: ${err.message}`);
  }
}

function fillSelect(select, values, preferred) {
  select.replaceChildren(...values.map((v) => el("option", { value: v }, v)));
  if (preferred && values.includes(preferred)) select.value = preferred;
}

function searchBody(strategy) {
  return JSON.stringify({ tenant: $("tenant").value, query: $("question").value.trim(), strategy,
                          k: Number($("k").value) || 10 });
}

// -- one strategy ---------------------------------------------------------------------------
async function search(event) {
  event.preventDefault();
  showError("");
  state.tenant = $("tenant").value;
  try {
    const resp = await api("/v1/search", { method: "POST", body: searchBody($("strategy").value),
                                           headers: { "Content-Type": "application/json" } });
    renderResults(resp);
  } catch (err) {
    showError(`Search failed: ${err.message}`);
  }
}

function renderResults(resp) {
  $("comparison").replaceChildren();
  $("signals-legend").hidden = true;
  const nodes = new Map(resp.results.map((n) => [n.node_id, n]));
  const title = $("results-title");
  title.hidden = false;
  title.textContent = `${resp.turns.length} ranked turns · ${resp.strategy} · ${fmtNum(resp.search_ms)} ms · store ${resp.version}`;
  $("results").replaceChildren(...resp.turns.map((turn, i) => hitCard(turn, i + 1, nodes.get(turn.via))));
  if (!resp.turns.length) $("results").append(el("li", { class: "muted" }, "Nothing in memory matched."));
  renderSignalsLegend(resp.results);
}

function renderSignalsLegend(results) {
  // the signals on the hits, each with what it means (the chips also say it on hover)
  const names = [...new Set(results.flatMap((n) => Object.keys(n.signals)))];
  const legend = $("signals-legend");
  legend.replaceChildren(el("h3", {}, "What the signals mean"),
    ...names.flatMap((k) => [el("dt", {}, el("span", { class: "chip" }, k)), el("dd", {}, signalMeaning(k) || "—")]));
  legend.hidden = !names.length;
}

function hitCard(turn, rank, via) {
  const signals = via ? Object.entries(via.signals).map(([k, v]) => el("span", { class: "chip", "data-signal": k,
    title: signalMeaning(k) }, `${k} ${fmtNum(v)}`)) : [];
  const kind = via ? el("span", { class: "chip kind", style: `background:${KIND_COLORS[via.kind] || "#888"}` },
                        via.kind === "turn" ? "turn hit" : `via ${via.kind}`) : null;
  const card = el("li", { class: "hit", "data-turn": turn.turn_id, "data-node": turn.node_id },
    el("span", { class: "rank" }, rank),
    el("span", { class: "meta" }, el("b", {}, fmtDate(turn.time)), ` · session ${turn.session_id} · turn `,
       el("b", {}, turn.turn_id), via ? ` · score ${fmtNum(via.score)}` : ""),
    el("span", { class: "text" }, turn.speaker ? `${turn.speaker}: ${turn.text}` : turn.text),
    el("span", { class: "signals" }, kind, signals));
  card.addEventListener("click", () => openHit(turn, card));
  return card;
}

// -- a hit: its session and its derived graph -------------------------------------------------
async function openHit(turn, card) {
  document.querySelectorAll(".hit.open").forEach((c) => c.classList.remove("open"));
  if (card) card.classList.add("open");
  showError("");
  const tenant = encodeURIComponent(state.tenant);
  try {
    const [session, graph] = await Promise.all([
      api(`/v1/session?tenant=${tenant}&session_id=${encodeURIComponent(turn.session_id)}` +
          `&around=${encodeURIComponent(turn.node_id)}&window=4`),
      api(`/v1/graph?tenant=${tenant}&node=${encodeURIComponent(turn.node_id)}&depth=2&limit=30`),
    ]);
    $("detail-pane").hidden = false;
    $("detail-title").textContent = `Turn ${turn.turn_id} · session ${turn.session_id} · ${fmtDate(session.time)}`;
    $("session").replaceChildren(...session.turns.map((t) => el("li", { class: t.node_id === session.focus ? "focus" : "" },
      el("span", { class: "tid" }, t.turn_id), t.speaker ? `${t.speaker}: ${t.text}` : t.text)));
    renderGraph(graph);
  } catch (err) {
    showError(`Could not open the hit: ${err.message}`);
  }
}

const KIND_ORDER = Object.keys(KIND_COLORS);

function layout(graph, width, height) {
  // the centre in the middle, each hop on a ring; on a ring the nodes are grouped by kind (a
  // sector per kind, in a fixed order), and within a kind they follow their parent's angle
  const pos = new Map([[graph.center, { x: width / 2, y: height / 2, angle: 0, hop: 0 }]]);
  const neighbours = new Map();
  const link = (a, b) => { if (!neighbours.has(a)) neighbours.set(a, []); neighbours.get(a).push(b); };
  for (const e of graph.edges) { link(e.src, e.dst); link(e.dst, e.src); }
  const side = Math.min(width, height);
  const radii = [0, side * 0.27, side * 0.46, side * 0.5];
  const kindRank = (k) => (KIND_ORDER.includes(k) ? KIND_ORDER.indexOf(k) : KIND_ORDER.length);
  for (const hop of [1, 2, 3]) {
    const ring = graph.nodes.filter((n) => n.hops === hop);
    const angleOf = (n) => {
      const p = (neighbours.get(n.node_id) || []).map((id) => pos.get(id)).find((q) => q && q.hop === hop - 1);
      return p ? p.angle : 0;
    };
    ring.sort((a, b) => kindRank(a.kind) - kindRank(b.kind) || angleOf(a) - angleOf(b));
    // a gap of one slot between kinds, so each kind reads as its own group
    const slots = ring.length + new Set(ring.map((n) => n.kind)).size;
    let slot = 0;
    ring.forEach((n, j) => {
      if (j > 0 && ring[j - 1].kind !== n.kind) slot += 1;
      const angle = (2 * Math.PI * slot) / slots - Math.PI / 2 + (hop > 1 ? Math.PI / slots : 0);
      slot += 1;
      pos.set(n.node_id, { x: width / 2 + radii[hop] * Math.cos(angle), y: height / 2 + radii[hop] * Math.sin(angle),
                           angle, hop });
    });
  }
  return pos;
}

// a node's edges and their labels show while the pointer is on it, or after a click (until the next)
function focusNode(svg, id, pinned) {
  if (pinned) svg.dataset.pinned = svg.dataset.pinned === id ? "" : id;
  const on = id || svg.dataset.pinned || "";
  const near = new Set([on]);
  svg.querySelectorAll(".edge").forEach((e) => {
    const mine = !!on && (e.dataset.src === on || e.dataset.dst === on);
    e.classList.toggle("on", mine);
    if (mine) { near.add(e.dataset.src); near.add(e.dataset.dst); }
  });
  svg.classList.toggle("focusing", !!on);  // the rest of the graph fades while a node is in focus
  svg.querySelectorAll(".node").forEach((n) => {
    n.classList.toggle("on", n.dataset.id === on);
    n.classList.toggle("near", !!on && near.has(n.dataset.id));
    n.classList.toggle("pinned", n.dataset.id === svg.dataset.pinned);
  });
}

function renderGraph(graph) {
  const width = 560, height = 420;
  const pos = layout(graph, width, height);
  const svg = svgEl("svg", { viewBox: `0 0 ${width} ${height}`, role: "img", "aria-label": "derived memory graph" });
  const edges = svgEl("g", { class: "edges" }), labels = svgEl("g", { class: "edge-labels" });
  const crowd = graph.nodes.length;  // past a dozen nodes, the outer ring's labels wait for the pointer
  graph.edges.forEach((e, i) => {
    const a = pos.get(e.src), b = pos.get(e.dst);
    if (!a || !b) return;
    const line = svgEl("line", { x1: a.x, y1: a.y, x2: b.x, y2: b.y, class: "edge", "data-src": e.src, "data-dst": e.dst,
                                 "data-edge": i });
    line.append(svgEl("title", {}, e.relation || e.kind));
    edges.append(line);
    // the label of an edge is drawn above every node, and only while one of its ends is in focus
    labels.append(svgEl("text", { x: (a.x + b.x) / 2, y: (a.y + b.y) / 2 - 3, "text-anchor": "middle", class: "edge edge-label",
                                  "data-src": e.src, "data-dst": e.dst, "data-edge": i }, e.relation || e.kind));
  });
  svg.append(edges);
  for (const n of graph.nodes) {
    const p = pos.get(n.node_id);
    const g = svgEl("g", { class: "node", "data-kind": n.kind, "data-id": n.node_id, tabindex: 0 });
    g.append(svgEl("title", {}, `${n.kind} ${n.node_id}\n${n.text}`));
    g.append(svgEl("circle", { cx: p.x, cy: p.y, r: n.hops === 0 ? 13 : 9, fill: KIND_COLORS[n.kind] || "#888",
                               stroke: "#fff", "stroke-width": 2 }));
    // a label sits outside its ring, on the side away from the centre, so labels do not meet in the middle
    const dx = Math.cos(p.angle), dy = Math.sin(p.angle);
    const at = n.hops === 0 ? { x: p.x, y: p.y - 19, anchor: "middle" }
      : { x: p.x + 13 * dx, y: p.y + 13 * dy + (dy > 0.3 ? 8 : dy < -0.3 ? -2 : 3),
          anchor: Math.abs(dx) < 0.3 ? "middle" : dx > 0 ? "start" : "end" };
    g.append(svgEl("text", { x: at.x, y: at.y, "text-anchor": at.anchor,
                             class: n.hops <= 1 || crowd <= 12 ? "node-label" : "node-label far" }, short(n.text, n.hops === 0 ? 40 : 22)));
    g.addEventListener("mouseenter", () => focusNode(svg, n.node_id, false));
    g.addEventListener("mouseleave", () => focusNode(svg, "", false));
    g.addEventListener("click", () => focusNode(svg, n.node_id, true));
    svg.append(g);
  }
  svg.append(labels);
  const xs = [...pos.values()].map((p) => p.x), ys = [...pos.values()].map((p) => p.y);
  // fit the view to the drawing, but never zoom in past a 520 x 300 window (labels stay small)
  const x0 = Math.min(...xs) - 120, x1 = Math.max(...xs) + 120, y0 = Math.min(...ys) - 25, y1 = Math.max(...ys) + 35;
  const w = Math.max(x1 - x0, 520), h = Math.max(y1 - y0, 300);
  svg.setAttribute("viewBox", `${(x0 + x1 - w) / 2} ${(y0 + y1 - h) / 2} ${w} ${h}`);
  $("graph").replaceChildren(svg);
  const kinds = [...new Set(graph.nodes.map((n) => n.kind))].sort((a, b) => KIND_ORDER.indexOf(a) - KIND_ORDER.indexOf(b));
  $("legend").replaceChildren(...kinds.map((k) => el("li", {}, el("i", { style: `background:${KIND_COLORS[k] || "#888"}` }), k)));
  $("graph-note").textContent = `${graph.nodes.length - 1} nodes, ${graph.edges.length} edges` +
    `${graph.truncated ? " (truncated)" : ""} · point at a node (or click it) to see its edges and their labels`;
  $("derived").replaceChildren(...graph.nodes.filter((n) => n.hops > 0).map((n) => el("li", {},
    el("span", { class: "chip kind", style: `background:${KIND_COLORS[n.kind] || "#888"}` }, n.kind), " ", n.text,
    n.turn_ids.length ? el("span", { class: "muted" }, `  (turns ${n.turn_ids.slice(0, 4).join(", ")})`) : "")));
}

// -- strategies side by side ---------------------------------------------------------------------
const PALETTE = ["#e6194b", "#3cb44b", "#4363d8", "#f58231", "#911eb4", "#42d4f4", "#f032e6", "#bfef45",
                 "#469990", "#9a6324", "#800000", "#808000", "#000075", "#fabed4", "#ffd8b1", "#aaffc3"];

function sharedColors(answers) {
  // a colour per turn that several strategies found (in order of first appearance); others stay grey
  const count = new Map();
  for (const resp of answers) for (const id of new Set(resp.turns.map((t) => t.node_id))) count.set(id, (count.get(id) || 0) + 1);
  const colors = new Map();
  for (const [id, n] of count) if (n > 1) colors.set(id, PALETTE[colors.size % PALETTE.length]);
  return colors;
}

async function compare() {
  showError("");
  state.tenant = $("tenant").value;
  const names = [...document.querySelectorAll("#compare-pick input:checked")].map((i) => i.value);
  if (!names.length || !$("question").value.trim()) {
    showError("Pick at least one strategy and type a question.");
    return;
  }
  try {
    const answers = await Promise.all(names.map((s) => api("/v1/search", {
      method: "POST", body: searchBody(s), headers: { "Content-Type": "application/json" } })));
    $("results").replaceChildren();
    $("signals-legend").hidden = true;
    $("detail-pane").hidden = true;
    const title = $("results-title");
    title.hidden = false;
    title.textContent = `${names.length} strategies side by side · a colour marks a turn several of them found`;
    const colors = sharedColors(answers);
    const grid = $("comparison");
    grid.style.gridTemplateColumns = `repeat(${Math.min(answers.length, 4)}, minmax(0, 1fr))`;
    grid.replaceChildren(...answers.map((resp) => el("div", { class: "col", "data-strategy": resp.strategy },
      el("h4", {}, `${resp.strategy} `, el("span", { class: "muted" }, `${fmtNum(resp.search_ms)} ms`)),
      el("ol", {}, resp.turns.map((t) => {
        const via = resp.results.find((n) => n.node_id === t.via);
        const item = el("li", { style: `border-left-color:${colors.get(t.node_id) || "#d5d9e0"}`, title: t.text },
          el("span", { class: "tid" }, t.turn_id), ` ${fmtDate(t.time).slice(0, 10)} · ${short(t.text, 80)}`,
          via && via.kind !== "turn" ? el("span", { class: "muted" }, ` · via ${via.kind}`) : null);
        item.addEventListener("click", () => openHit(t, null));
        return item;
      })))));
  } catch (err) {
    showError(`Comparison failed: ${err.message}`);
  }
}

$("connect").addEventListener("submit", connect);
$("query").addEventListener("submit", search);
$("compare").addEventListener("click", compare);
connect("quietly");  // with the tab's token, or none: a service started with --open-local needs none
