// The gateway console: a hash-routed page over the admin and read APIs (docs/console.md).
// Every value from the server goes into the page through textContent (h() below), never as HTML.
"use strict";

const main = document.getElementById("main");
let timer = null; // the running page's poller, stopped on navigation

// ------------------------------------------------------------------ helpers
function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (v !== undefined && v !== null && v !== false) el.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

async function api(method, path, body) {
  const opts = { method, headers: {}, credentials: "same-origin" };
  if (body !== undefined) {
    opts.headers["Content-Type"] = "application/json";
    opts.body = JSON.stringify(body);
  }
  const r = await fetch(path, opts);
  if (r.status === 204) return null;
  const text = await r.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch (e) { data = text; }
  if (!r.ok) {
    const why = data && data.detail ? data.detail : `${r.status} ${r.statusText}`;
    throw new Error(typeof why === "string" ? why : JSON.stringify(why));
  }
  return data;
}

const enc = encodeURIComponent;
const fmtTime = (ms) => (ms ? new Date(ms).toISOString().replace("T", " ").replace("Z", "") : "");
const fmtNum = (n) => (n === null || n === undefined ? "" : Number(n).toLocaleString("en-US"));
function fmtBytes(n) {
  if (n === null || n === undefined) return "";
  const u = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
  return `${n.toFixed(i ? 1 : 0)} ${u[i]}`;
}

function toast(msg, bad) {
  const t = document.getElementById("toast");
  t.textContent = msg;
  t.style.background = bad ? "#c0392b" : "#1d2330";
  t.style.display = "block";
  setTimeout(() => { t.style.display = "none"; }, 4000);
}

// headers ending in "#" are numeric columns (right-aligned)
function table(headers, rows, id) {
  const num = headers.map((x) => (x.endsWith("#") ? "num" : null));
  return h("table", { id },
    h("thead", {}, h("tr", {}, headers.map((x, i) => h("th", { class: num[i] }, x.replace(/#$/, ""))))),
    h("tbody", {}, rows.length ? rows.map((r) => h("tr", {}, r.map((c, i) => h("td", { class: num[i] }, c))))
      : h("tr", {}, h("td", { colspan: headers.length, class: "muted" }, "nothing here"))));
}

function page(title, ...children) {
  main.replaceChildren(h("h1", {}, title), ...children);
}

function failed(e) {
  main.replaceChildren(h("h1", {}, "Error"), h("p", { class: "bad" }, e.message || String(e)));
}

// ------------------------------------------------------------------ overview
const samples = []; // [{time, protocols}] of the overview poller
const COLORS = ["#2f6fdb", "#1e8e3e", "#c0392b", "#8e44ad", "#d35400", "#16a085"];

async function overview() {
  const cards = h("div", { class: "cards", id: "overview-cards" });
  const chart = h("div", { id: "rates" });
  page("Overview", cards, h("h2", {}, "Messages per second, last 5 minutes"), chart,
    h("h2", {}, "Per protocol"), h("div", { id: "per-protocol" }), h("div", { id: "bridges" }));
  async function tick() {
    const o = await api("GET", "/admin/overview");
    samples.push(o);
    while (samples.length > 150) samples.shift();
    const conns = Object.values(o.protocols).reduce((a, p) => a + p.connections, 0);
    cards.replaceChildren(
      card("Topics", fmtNum(o.topics)), card("Groups", fmtNum(o.groups)),
      card("Connections", fmtNum(conns)),
      card("Commit log", fmtBytes(o.store.commitlog_bytes)),
      card("Disk free", fmtBytes(o.store.disk_free_bytes)));
    const rates = rateRows(o);
    document.getElementById("per-protocol").replaceChildren(table(
      ["protocol", "connections#", "in/s#", "out/s#", "messages in#", "messages out#"],
      Object.entries(o.protocols).map(([name, p]) => [name, fmtNum(p.connections),
        (rates[name] || [0, 0])[0].toFixed(1), (rates[name] || [0, 0])[1].toFixed(1),
        fmtNum(p.messages_in), fmtNum(p.messages_out)]), "protocols"));
    chart.replaceChildren(drawChart());
    const bridges = o.bridges || []; // [[bridge]] links (docs/bridges.md)
    document.getElementById("bridges").replaceChildren(...(bridges.length ? [h("h2", {}, "Bridges"), table(
      ["bridge", "from", "to", "state", "forwarded#", "in flight#", "lag#", "last error"],
      bridges.map((b) => [b.name, b.from, b.to, b.state, fmtNum(b.forwarded), fmtNum(b.inflight),
        fmtNum(b.lag_messages), b.last_error]), "bridge-table")] : []));
  }
  await tick();
  timer = setInterval(() => tick().catch(() => {}), 2000);
}

function card(k, v) {
  return h("div", { class: "card" }, h("div", { class: "v" }, v || "–"), h("div", { class: "k" }, k));
}

function rateRows(o) {
  const prev = samples.length > 1 ? samples[samples.length - 2] : null;
  const out = {};
  if (!prev) return out;
  const dt = Math.max(o.time - prev.time, 0.001);
  for (const [name, p] of Object.entries(o.protocols)) {
    const q = prev.protocols[name] || { messages_in: p.messages_in, messages_out: p.messages_out };
    out[name] = [(p.messages_in - q.messages_in) / dt, (p.messages_out - q.messages_out) / dt];
  }
  return out;
}

function drawChart() {
  const W = 900, H = 180, ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("class", "chart");
  svg.setAttribute("width", W);
  svg.setAttribute("height", H);
  const series = {};
  for (let i = 1; i < samples.length; i++) {
    const a = samples[i - 1], b = samples[i], dt = Math.max(b.time - a.time, 0.001);
    for (const [name, p] of Object.entries(b.protocols)) {
      const q = a.protocols[name] || p;
      (series[`${name} in`] = series[`${name} in`] || []).push((p.messages_in - q.messages_in) / dt);
      (series[`${name} out`] = series[`${name} out`] || []).push((p.messages_out - q.messages_out) / dt);
    }
  }
  const names = Object.keys(series).filter((k) => series[k].some((v) => v > 0));
  const top = Math.max(1, ...names.flatMap((k) => series[k]));
  const legend = h("div", { class: "legend" });
  names.forEach((k, i) => {
    const pts = series[k].map((v, j) => `${(j / 149) * W},${H - 10 - (v / top) * (H - 20)}`).join(" ");
    const line = document.createElementNS(ns, "polyline");
    line.setAttribute("points", pts);
    line.setAttribute("fill", "none");
    line.setAttribute("stroke", COLORS[i % COLORS.length]);
    line.setAttribute("stroke-width", "2");
    svg.append(line);
    legend.append(h("span", { style: `color:${COLORS[i % COLORS.length]}` }, `■ ${k}`));
  });
  const label = document.createElementNS(ns, "text");
  label.setAttribute("x", 6);
  label.setAttribute("y", 14);
  label.setAttribute("font-size", "11");
  label.textContent = `max ${top.toFixed(1)}/s`;
  svg.append(label);
  return h("div", {}, svg, legend);
}

// ------------------------------------------------------------------ topics
async function topics() {
  const list = await api("GET", "/admin/topics");
  const form = h("form", { class: "inline", id: "create-topic", onsubmit: async (ev) => {
    ev.preventDefault();
    const f = new FormData(ev.target);
    const body = { name: f.get("name") };
    if (f.get("queues")) body.queues = Number(f.get("queues"));
    if (f.get("retention_ms")) body.retention_ms = Number(f.get("retention_ms"));
    try { await api("POST", "/admin/topics", body); toast(`topic ${body.name} saved`); route(); }
    catch (e) { toast(e.message, true); }
  } },
  h("label", {}, "name", h("input", { name: "name", required: true })),
  h("label", {}, "queues", h("input", { name: "queues", type: "number", min: 1, max: 1024, style: "width:80px" })),
  h("label", {}, "retention ms", h("input", { name: "retention_ms", type: "number", min: 1, style: "width:120px" })),
  h("button", { type: "submit" }, "Create"));
  page("Topics", form, table(["topic", "queues#", "messages#", "retention", "compacted", ""],
    list.map((t) => [
      h("a", { href: `#/topics/${enc(t.name)}` }, t.name),
      t.read_queues > t.queues ? `${t.queues} (+${t.read_queues - t.queues} sealed)` : fmtNum(t.queues),
      fmtNum(t.messages),
      t.retention_ms ? `${t.retention_ms} ms` : (t.retention_bytes ? fmtBytes(t.retention_bytes) : "store default"),
      t.compacted ? "yes" : "",
      h("button", { class: "danger", onclick: async () => {
        if (!confirm(`Delete topic ${t.name}?`)) return;
        try { await api("DELETE", `/admin/topics/${enc(t.name)}`); toast(`deleted ${t.name}`); route(); }
        catch (e) { toast(e.message, true); }
      } }, "Delete"),
    ]), "topics"));
}

async function topicDetail(name) {
  const t = await api("GET", `/admin/topics/${enc(name)}`);
  const consumers = await api("GET", `/admin/consumers?topic=${enc(name)}`);
  page(`Topic ${name}`,
    h("div", { class: "cards" }, card("Queues", fmtNum(t.queues)), card("Messages", fmtNum(t.messages)),
      card("Retention", t.retention_ms ? `${t.retention_ms} ms` : "store default")),
    h("p", {}, h("a", { href: `#/messages?topic=${enc(name)}` }, "Browse messages")),
    h("h2", {}, "Queues"),
    table(["queue#", "min offset#", "max offset#"],
      t.queue_offsets.map((q) => [fmtNum(q.queue_id), fmtNum(q.min_offset), fmtNum(q.max_offset)]), "queues"),
    h("h2", {}, "Groups"),
    table(["group", "backlog#", "in flight#"], Object.entries(t.groups).map(([g, b]) => [
      h("a", { href: `#/groups/${enc(g)}` }, g), fmtNum(b.backlog), fmtNum(b.inflight)]), "topic-groups"),
    h("h2", {}, "Consumers"), consumersTable(consumers));
}

// live consumers of every protocol (GET /admin/consumers): each adapter's own facts in "details"
function consumersTable(list) {
  return table(["protocol", "client", "details", "group", "remote", "since"], list.map((c) => [c.protocol, c.client_id,
    h("span", { class: "details" }, Object.entries(c.details).map(([k, v]) =>
      h("span", { class: "detail", "data-k": k }, h("span", { class: "muted" }, k), ` ${v}`))),
    c.group ? h("a", { href: `#/groups/${enc(c.group)}` }, c.group) : "",
    c.remote, fmtTime(c.since * 1000)]), "consumers");
}

// ------------------------------------------------------------------ groups
async function groups() {
  const list = await api("GET", "/admin/groups");
  page("Groups", table(["group", "topics", "backlog#", "in flight#", "max attempts#"], list.map((g) => {
    const ts = Object.entries(g.topics);
    return [h("a", { href: `#/groups/${enc(g.name)}` }, g.name), ts.map(([t]) => t).join(", "),
      fmtNum(ts.reduce((a, [, b]) => a + b.backlog, 0)), fmtNum(ts.reduce((a, [, b]) => a + b.inflight, 0)),
      fmtNum(g.max_attempts)];
  }), "groups"));
}

async function groupDetail(name) {
  const g = await api("GET", `/admin/groups/${enc(name)}`);
  const consumers = await api("GET", `/admin/consumers?group=${enc(name)}`);
  let dlq = 0;
  try { dlq = (await api("GET", `/admin/topics/${enc(`%DLQ%${name}`)}`)).messages; } catch (e) { dlq = 0; }
  const sections = [];
  for (const topic of Object.keys(g.topics)) {
    const qs = await api("GET", `/read/topics/${enc(topic)}/queues`);
    const committed = await api("GET", `/read/groups/${enc(name)}/topics/${enc(topic)}/offsets`);
    const byQ = Object.fromEntries(committed.queues.map((q) => [q.queue_id, q.offset]));
    const rows = qs.queues.map((q) => {
      const c = byQ[q.queue_id] ?? -1;
      const lag = q.max_offset - Math.max(c, q.min_offset);
      return [fmtNum(q.queue_id), fmtNum(q.min_offset), fmtNum(q.max_offset), c < 0 ? "–" : fmtNum(c), fmtNum(lag)];
    });
    const reset = async (to) => {
      const offsets = Object.fromEntries(qs.queues.map((q) => [q.queue_id, to === "earliest" ? q.min_offset : q.max_offset]));
      if (!confirm(`Reset ${name} on ${topic} to the ${to} offsets?`)) return;
      try {
        await api("POST", `/read/groups/${enc(name)}/topics/${enc(topic)}/offsets`, { offsets });
        toast(`${name} on ${topic} reset to ${to}`);
        route();
      } catch (e) { toast(e.message, true); }
    };
    sections.push(h("h2", {}, `Topic ${topic}`),
      h("p", {}, `backlog ${fmtNum(g.topics[topic].backlog)}, in flight ${fmtNum(g.topics[topic].inflight)} `,
        h("button", { class: "secondary", onclick: () => reset("earliest") }, "Reset to earliest"), " ",
        h("button", { class: "secondary", onclick: () => reset("latest") }, "Reset to latest")),
      table(["queue#", "min#", "max#", "committed#", "lag#"], rows, `lag-${topic}`));
  }
  page(`Group ${name}`,
    h("div", { class: "cards" }, card("Max attempts", fmtNum(g.max_attempts)),
      card("Retry back-off", `${g.retry_initial_ms} ms × ${g.retry_multiplier}`),
      card("Dead letters", h("a", { href: `#/dlq?group=${enc(name)}` }, fmtNum(dlq)))),
    h("h2", {}, "Consumers"), consumersTable(consumers),
    ...sections);
}

// ------------------------------------------------------------------ connections
async function connections() {
  const list = await api("GET", "/admin/connections");
  page("Connections", table(["protocol", "client", "user", "address", "since", "in#", "out#", "in/s#", "out/s#", ""],
    list.map((c) => {
      const secs = Math.max(Date.now() / 1000 - c.since, 1);
      return [c.protocol, c.client_id, c.user || "", c.remote, fmtTime(c.since * 1000), fmtNum(c.messages_in),
        fmtNum(c.messages_out), c.messages_in === null ? "" : (c.messages_in / secs).toFixed(2),
        c.messages_out === null ? "" : (c.messages_out / secs).toFixed(2),
        c.closable ? h("button", { class: "danger", "data-close": c.id, onclick: async () => {
          if (!confirm(`Close ${c.protocol} connection ${c.client_id}?`)) return;
          try { await api("DELETE", `/admin/connections/${enc(c.id)}`); toast("closed"); route(); }
          catch (e) { toast(e.message, true); }
        } }, "Close") : ""];
    }), "connections"));
}

// ------------------------------------------------------------------ messages
function bodyView(m, mode) {
  const b64 = m.body_base64 || "";
  const raw = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
  if (mode === "hex") return Array.from(raw, (x) => x.toString(16).padStart(2, "0")).join(" ");
  const text = m.body ?? new TextDecoder().decode(raw);
  if (mode === "json") {
    try { return JSON.stringify(JSON.parse(text), null, 2); } catch (e) { return "(not JSON) " + text; }
  }
  return text;
}

// what each protocol's consumer receives, as the adapters' own outbound mapping builds it (the
// API's `views`); shown as JSON, exactly as the server computed it
const VIEW_NAMES = { mqtt: "MQTT", amqp: "AMQP 0-9-1", cloudevents: "CloudEvents", grpc: "RocketMQ 5 (gRPC)" };

function protocolViews(m) {
  return table(["protocol", "how a consumer sees it"], Object.entries(m.views || {}).map(([p, v]) => [
    VIEW_NAMES[p] || p, h("pre", { class: "view", "data-protocol": p }, JSON.stringify(v, null, 2))]),
  null);
}

function messageRow(m, mode) {
  const id = m.id;
  return h("div", { class: "message", "data-id": id },
    h("h2", {}, `${m.topic} / queue ${m.queue} / offset ${m.offset}`),
    h("p", { class: "muted" }, `id ${id} · stored ${fmtTime(m.store_time)} · ${fmtBytes(m.size)} `,
      h("a", { href: `#/trace/${enc(id)}` }, "trace")),
    h("pre", { class: "body" }, bodyView(m, mode)),
    table(["property", "value"], Object.entries(m.properties || {}).map(([k, v]) => [k, v]), null),
    h("div", { class: "protocol-views" }, protocolViews(m)));
}

async function messages(params) {
  const mode = params.get("format") || "text";
  const form = h("form", { class: "inline", id: "browse", onsubmit: (ev) => {
    ev.preventDefault();
    const f = new FormData(ev.target);
    const q = new URLSearchParams();
    for (const [k, v] of f.entries()) if (v) q.set(k, v);
    location.hash = `#/messages?${q}`;
  } },
  h("label", {}, "topic", h("input", { name: "topic", value: params.get("topic") || "" })),
  h("label", {}, "queue", h("input", { name: "queue", type: "number", min: 0, style: "width:70px", value: params.get("queue") || "" })),
  h("label", {}, "offset", h("input", { name: "offset", type: "number", min: 0, style: "width:90px", value: params.get("offset") || "" })),
  h("label", {}, "count", h("input", { name: "count", type: "number", min: 1, max: 200, style: "width:70px", value: params.get("count") || "20" })),
  h("label", {}, "or id", h("input", { name: "id", value: params.get("id") || "" })),
  h("label", {}, "or key", h("input", { name: "key", value: params.get("key") || "" })),
  h("label", {}, "body as", h("select", { name: "format" }, ["text", "json", "hex"].map((x) =>
    h("option", { value: x, selected: x === mode }, x)))),
  h("button", { type: "submit" }, "Show"));
  let found = null;
  if (params.get("id")) found = await api("GET", `/admin/messages/${enc(params.get("id"))}`);
  else if (params.get("key")) found = await api("GET", `/admin/messages?key=${enc(params.get("key"))}`);
  else if (params.get("topic")) {
    const q = new URLSearchParams({ count: params.get("count") || "20" });
    if (params.get("queue")) q.set("queue", params.get("queue"));
    if (params.get("offset")) q.set("offset", params.get("offset"));
    found = await api("GET", `/admin/topics/${enc(params.get("topic"))}/messages?${q}`);
  }
  const list = found;
  page("Messages", form, list === null ? h("p", { class: "muted" }, "Pick a topic (and queue, offset), a message id or a key.")
    : h("div", { id: "message-list" }, list.length ? list.map((m) => messageRow(m, mode)) : h("p", { class: "muted" }, "no messages")));
}

// ------------------------------------------------------------------ dead letters
async function dlq(params) {
  const group = params.get("group") || "";
  const groupsList = (await api("GET", "/admin/groups")).map((g) => g.name);
  const pick = h("form", { class: "inline", onsubmit: (ev) => {
    ev.preventDefault();
    location.hash = `#/dlq?group=${enc(new FormData(ev.target).get("group"))}`;
  } }, h("label", {}, "group", h("select", { name: "group", id: "dlq-group" },
    h("option", { value: "" }, "–"), groupsList.map((g) => h("option", { value: g, selected: g === group }, g)))),
  h("button", { type: "submit" }, "Show"));
  if (!group) return page("Dead letters", pick);
  const list = await api("GET", `/admin/dlq/${enc(group)}?count=200`);
  const boxes = list.map((m) => h("input", { type: "checkbox", value: m.id, class: "pick", disabled: m.redriven }));
  const redrive = h("button", { id: "redrive", onclick: async () => {
    const ids = boxes.filter((b) => b.checked).map((b) => b.value);
    try {
      const r = await api("POST", `/admin/dlq/${enc(group)}/redrive`, ids.length ? { ids } : {});
      toast(`redriven ${r.redriven}`);
      route();
    } catch (e) { toast(e.message, true); }
  } }, "Redrive selected (none: all)");
  page(`Dead letters of ${group}`, pick, h("p", {}, redrive),
    table(["", "id", "original topic", "reason", "attempts#", "stored", "redriven", "body"], list.map((m, i) => [boxes[i],
      h("a", { href: `#/trace/${enc(m.id)}` }, m.id), m.original_topic || "", m.reason || "", fmtNum(m.attempts),
      fmtTime(m.store_time), m.redriven ? "yes" : "", (m.body ?? "(binary)").slice(0, 80)]), "dead-letters"));
}

// ------------------------------------------------------------------ trace
async function trace(id) {
  const t = await api("GET", `/admin/messages/${enc(id)}/trace`);
  const t0 = t.events.length ? t.events[0].time : 0;
  page(`Trace of ${id}`,
    h("p", { class: "muted" }, `topic ${t.topic} · trace id ${t.trace_id} · traceparent ${t.traceparent}`),
    h("ul", { class: "timeline", id: "timeline" }, t.events.map((e) => h("li", { "data-event": e.event },
      h("span", { class: "ev" }, e.event), e.protocol ? h("span", { class: "proto" }, e.protocol) : null,
      h("div", { class: "muted" }, `${fmtTime(e.time)} (+${e.time - t0} ms)` +
        [e.client_id && ` client ${e.client_id}`, e.user && ` user ${e.user}`, e.group && ` group ${e.group}`,
          e.queue_id !== null && e.queue_id !== undefined && ` queue ${e.queue_id}`,
          e.offset !== null && e.offset !== undefined && ` offset ${e.offset}`,
          e.attempt && ` attempt ${e.attempt}`, e.detail && ` · ${e.detail}`].filter(Boolean).join(""))))));
}

// ------------------------------------------------------------------ users and ACL
async function users() {
  let us, rules;
  try {
    us = await api("GET", "/admin/users");
    rules = await api("GET", "/admin/acl");
  } catch (e) {
    return page("Users & ACL", h("p", { class: "muted" }, `Not available: ${e.message} (auth is off?)`));
  }
  page("Users & ACL",
    table(["user", "role", "vhosts"], us.map((u) => [u.name, u.role, (u.vhosts || []).join(", ")]), "users"),
    h("h2", {}, "ACL rules"),
    table(["subject", "resource", "pattern", "actions", "effect"], rules.map((r) => [r.subject, r.kind, r.pattern,
      (r.actions || []).join(", "), r.effect]), "acl"));
}

// ------------------------------------------------------------------ routing
async function route() {
  if (timer) { clearInterval(timer); timer = null; }
  const [path, query] = (location.hash.slice(1) || "/").split("?");
  const params = new URLSearchParams(query || "");
  const parts = path.split("/").filter(Boolean).map(decodeURIComponent);
  const name = parts[0] || "overview";
  document.querySelectorAll("header nav a").forEach((a) => a.classList.toggle("active", a.dataset.page === name));
  try {
    if (name === "overview") await overview();
    else if (name === "topics") await (parts[1] ? topicDetail(parts[1]) : topics());
    else if (name === "groups") await (parts[1] ? groupDetail(parts[1]) : groups());
    else if (name === "connections") await connections();
    else if (name === "messages") await messages(params);
    else if (name === "dlq") await dlq(params);
    else if (name === "trace") await trace(parts[1]);
    else if (name === "users") await users();
    else page("Not found", h("p", {}, `no page ${name}`));
    main.setAttribute("data-ready", name);
  } catch (e) {
    failed(e);
    main.setAttribute("data-ready", "error");
  }
}

window.addEventListener("hashchange", route);
route();
