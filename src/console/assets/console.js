// The shardmq console: one script for every page; it reads the JSON API of the same port
// (/api/cluster, /api/topics, /api/groups, /api/message, /api/history) and writes the page.
"use strict";

const page = { "/": "cluster", "/topics": "topics", "/groups": "groups",
  "/message": "message", "/charts": "charts" }[location.pathname] || "cluster";
const content = document.getElementById("content");
const status = document.getElementById("status");

function esc(value) {
  return String(value === null || value === undefined ? "-" : value)
    .replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;").replace(/"/g, "&quot;");
}
function num(value, digits) {
  if (value === null || value === undefined || value === "") return "-";
  const n = Number(value);
  return isNaN(n) ? esc(value) : n.toFixed(digits || 0);
}
function bytes(value) {
  let n = Number(value || 0), unit = 0;
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  while (n >= 1024 && unit < units.length - 1) { n /= 1024; unit++; }
  return n.toFixed(unit ? 1 : 0) + " " + units[unit];
}
function table(headers, rows) {
  return "<table><tr>" + headers.map(h => "<th>" + esc(h) + "</th>").join("") + "</tr>" +
    rows.map(r => "<tr>" + r.join("") + "</tr>").join("") + "</table>";
}
const td = (v, cls) => "<td" + (cls ? ' class="' + cls + '"' : "") + ">" + v + "</td>";
async function api(path, options) {
  const response = await fetch(path, options);
  const body = await response.json();
  if (!response.ok) throw new Error(body.error || response.status);
  return body;
}
function warnings(body) {
  return (body.warnings || []).map(w => '<p class="warn">' + esc(w) + "</p>").join("");
}
function showMode(body) {
  document.getElementById("mode").textContent = body.writeEnabled ?
    "writes enabled (--console-write)" : "read-only";
}

async function cluster() {
  const body = await api("/api/cluster");
  showMode(body);
  let html = "";
  for (const c of body.clusters) {
    html += "<h2>Cluster " + esc(c.name) + "</h2>";
    html += table(["Shard (broker)", "Role", "Address", "Version", "Produce msg/s",
      "Consume msg/s", "Put today", "Get today", "Commitlog", "Disk ratio"],
      c.brokers.map(b => {
        const r = b.runtime || {};
        const commitlog = Number(r.commitLogMaxOffset || 0) - Number(r.commitLogMinOffset || 0);
        return [td(esc(b.brokerName)), td(b.brokerId === 0 ? "master" : "slave " + b.brokerId),
          td(esc(b.addr)), td(esc(b.version)),
          td(num(b.produceTps, 1), "num"), td(num(b.consumeTps, 1), "num"),
          td(num(r.msgPutTotalTodayNow), "num"), td(num(r.msgGetTotalTodayNow), "num"),
          td(bytes(commitlog), "num"), td(esc(r.commitLogDiskRatio), "num")];
      }));
  }
  return html + warnings(body);
}

async function topics() {
  const body = await api("/api/topics");
  showMode(body);
  const user = body.topics.filter(t => !t.system), system = body.topics.filter(t => t.system);
  let html = "<h2>Topics</h2>" + table(["Topic", "Queues", "Min offset", "Max offset",
    "Messages", "Produce msg/s"], user.map(t => {
    const queues = t.queues || [];
    const min = queues.reduce((s, q) => s + q.minOffset, 0);
    const max = queues.reduce((s, q) => s + q.maxOffset, 0);
    return [td(esc(t.topic)), td(queues.length, "num"), td(min, "num"), td(max, "num"),
      td(max - min, "num"), td(num(t.produceTps, 1), "num")];
  }));
  for (const t of user.filter(t => t.queues && t.queues.length)) {
    html += "<h2>Queues of " + esc(t.topic) + "</h2>" + table(
      ["Broker", "Queue", "Min offset", "Max offset", "Last update"],
      t.queues.map(q => [td(esc(q.brokerName)), td(q.queueId, "num"), td(q.minOffset, "num"),
        td(q.maxOffset, "num"), td(q.lastUpdateTimestamp ?
          new Date(q.lastUpdateTimestamp).toISOString() : "-")]));
  }
  html += '<p class="muted">System topics: ' + system.map(t => esc(t.topic)).join(", ") + "</p>";
  html += writeForm(body, "topic", "Create a topic", [["topic", "name"], ["queues", "queues (8)"]]);
  return html + warnings(body);
}

async function groups() {
  const body = await api("/api/groups");
  showMode(body);
  const user = body.groups.filter(g => !g.system);
  let html = "<h2>Consumer groups</h2>" + table(["Group", "Clients", "Topics", "Lag",
    "Consume msg/s"], user.map(g => {
    const p = g.progress || {};
    const topicsOf = [...new Set((p.queues || []).map(q => q.topic))];
    return [td(esc(g.group)), td((p.clients || []).length, "num"), td(esc(topicsOf.join(", "))),
      td('<span class="lag">' + num(p.totalLag) + "</span>", "num"),
      td(num(g.consumeRate, 1), "num")];
  }));
  for (const g of user) {
    const p = g.progress;
    if (g.error) html += '<p class="warn">' + esc(g.group) + ": " + esc(g.error) + "</p>";
    if (!p || !(p.queues || []).length) continue;
    html += "<h2>Lag of " + esc(g.group) + " per queue</h2>" + table(
      ["Topic", "Broker", "Queue", "Broker offset", "Consumer offset", "Lag"],
      p.queues.map(q => [td(esc(q.topic)), td(esc(q.brokerName)), td(q.queueId, "num"),
        td(q.brokerOffset, "num"), td(q.consumerOffset, "num"),
        td('<span class="lag">' + q.lag + "</span>", "num")]));
    if ((p.clients || []).length) {
      html += table(["Client", "Address", "Language", "Version"], p.clients.map(c =>
        [td(esc(c.clientId)), td(esc(c.clientAddr)), td(esc(c.language)), td(esc(c.version))]));
    }
  }
  html += writeForm(body, "group", "Create a subscription group", [["group", "name"]]);
  return html + warnings(body);
}

function writeForm(body, kind, title, fields) {
  const disabled = body.writeEnabled ? "" : " disabled";
  return "<h2>" + esc(title) + "</h2>" + '<form method="post" action="/api/' + kind +
    '" data-kind="' + kind + '">' + fields.map(f => '<input name="' + f[0] +
    '" placeholder="' + f[1] + '"' + disabled + "> ").join("") +
    "<button" + disabled + ">Create</button> " + (body.writeEnabled ? "" :
    '<span class="muted">read-only: start the node with --console-write</span>') +
    '<span class="result"></span></form>';
}

document.addEventListener("submit", async event => {
  const form = event.target;
  event.preventDefault();
  const result = form.querySelector(".result");
  try {
    await api(form.action, { method: "POST", body: new URLSearchParams(new FormData(form)) });
    result.textContent = " created";
    show();
  } catch (error) {
    result.textContent = " " + error.message;
  }
});

async function message() {
  const params = new URLSearchParams(location.search);
  let html = '<h2>Message lookup</h2><form method="get" action="/message" class="lookup">' +
    '<input name="topic" placeholder="topic" value="' + esc(params.get("topic") || "") + '"> ' +
    '<input name="key" placeholder="key" value="' + esc(params.get("key") || "") + '"> or ' +
    '<input name="id" placeholder="msgId" value="' + esc(params.get("id") || "") + '"> ' +
    "<button>Look up</button></form>";
  if (!params.get("key") && !params.get("id")) return html;
  const body = await api("/api/message?" + params.toString());
  html += "<p>" + body.messages.length + " message(s)</p>";
  for (const m of body.messages) {
    const props = Object.entries(m.properties || {});
    html += table(["Field", "Value"], [
      ["Topic", m.topic], ["Message ID", m.msgId], ["Unique key", m.uniqKey],
      ["Keys", m.keys], ["Tags", m.tags], ["Broker / queue / offset",
        m.brokerName + " / " + m.queueId + " / " + m.queueOffset],
      ["Stored", new Date(m.storeTimestamp).toISOString()], ["Body length", m.bodyLength],
    ].map(r => [td(esc(r[0])), td(esc(r[1]))]).concat(props.map(p =>
      [td("property " + esc(p[0])), td(esc(p[1]))])));
    html += "<pre>" + esc(m.bodyPreview) + "</pre>";
  }
  return html + warnings(body);
}

function chart(id, title, points, series) {
  return "<h2>" + esc(title) + '</h2><canvas id="' + id + '" width="900" height="180"></canvas>' +
    '<div class="legend">' + series.map(s => '<span style="color:' + s.color + '">■ ' +
    esc(s.label) + " (now " + num(points.length ? points[points.length - 1][s.key] : null, 1) +
    ")</span>").join("") + "</div>";
}
function draw(id, points, series) {
  const canvas = document.getElementById(id), g = canvas.getContext("2d");
  const w = canvas.width, h = canvas.height, pad = 40;
  let max = 1;
  for (const p of points) for (const s of series) max = Math.max(max, p[s.key] || 0);
  g.clearRect(0, 0, w, h);
  g.fillStyle = "#7a8394"; g.font = "11px sans-serif";
  g.fillText(max.toFixed(1), 2, 12); g.fillText("0", 2, h - 4);
  g.strokeStyle = "#dde1e8"; g.strokeRect(pad, 4, w - pad - 4, h - 12);
  if (points.length < 2) return;
  const t0 = points[0].atMs, span = Math.max(1, points[points.length - 1].atMs - t0);
  for (const s of series) {
    g.strokeStyle = s.color; g.lineWidth = 2; g.beginPath();
    let started = false;
    for (const p of points) {
      if (p[s.key] === null || p[s.key] === undefined) { started = false; continue; }
      const x = pad + (p.atMs - t0) / span * (w - pad - 4);
      const y = h - 8 - p[s.key] / max * (h - 16);
      if (started) g.lineTo(x, y); else g.moveTo(x, y);
      started = true;
      g.fillStyle = s.color;
      g.fillRect(x - 2, y - 2, 4, 4);  // a point between gaps shows too
    }
    g.stroke();
  }
}
const rateSeries = [{ key: "produceTps", label: "produce msg/s", color: "#2060c0" },
  { key: "consumeTps", label: "consume msg/s", color: "#20a060" }];
const latencySeries = [{ key: "sendP50Ms", label: "send p50 ms", color: "#2060c0" },
  { key: "sendP99Ms", label: "send p99 ms", color: "#c04020" }];
async function charts() {
  const body = await api("/api/history");
  content.innerHTML = chart("rates", "Produce and consume rate (last 10 minutes)",
    body.points, rateSeries) + chart("latency",
    "Send latency percentiles (rocketmq_rpc_latency, SEND codes)", body.points, latencySeries);
  draw("rates", body.points, rateSeries);
  draw("latency", body.points, latencySeries);
  return null;
}

const pages = { cluster, topics, groups, message, charts };
async function show() {
  for (const link of document.querySelectorAll("nav a")) {
    link.classList.toggle("current", link.dataset.page === page);
  }
  try {
    const html = await pages[page]();
    if (html !== null) content.innerHTML = html;
    status.textContent = "updated " + new Date().toLocaleTimeString();
  } catch (error) {
    status.textContent = "error: " + error.message;
    status.className = "warn";
  }
}
show();
if (page === "charts") setInterval(show, 2000);
