// rsnotify status page: plain JavaScript, no build step. Reads the admin API (/admin/...) and
// draws the view the path names: / (the hub), /topics/{tid}, /subscriptions/{sid}.
"use strict";

const POLL_MS = 2000;
const TOKEN_KEY = "rsnotify-admin-token";
const HISTORY_MS = 20000;          // the per-minute history changes once a minute: read it this often
const main = document.getElementById("main");
let timer = null;
let history = {rows: null, at: 0};
let chartSpan = "data";           // the history chart's span: "data" (zoomed to it), "60" or "360" minutes

// --- small helpers ---------------------------------------------------------------------------

function esc(value) {
  return String(value ?? "").replace(/[&<>"']/g, (c) => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c]));
}
function num(n) { return Number(n || 0).toLocaleString("en-US"); }
function time(epochSeconds) {
  if (!epochSeconds) return "—";
  return new Date(epochSeconds * 1000).toISOString().replace("T", " ").replace(/\.\d+Z$/, " UTC");
}
function ms(seconds) { return seconds == null ? "—" : (seconds * 1000).toFixed(seconds < 0.1 ? 1 : 0) + " ms"; }
function duration(seconds) {
  const s = Math.max(0, Math.floor(seconds));
  if (s >= 86400) return Math.floor(s / 86400) + " d";
  if (s >= 3600) return Math.floor(s / 3600) + " h";
  if (s >= 60) return Math.floor(s / 60) + " min";
  return s + " s";
}
function card(id, label, value, cls) {
  return `<div class="card"><div class="n ${cls || ""}" id="${id}" data-value="${esc(value)}">${num(value)}</div>` +
         `<div class="l">${esc(label)}</div></div>`;
}
function table(headers, rows, id) {
  const head = headers.map((h) => `<th class="${h.startsWith("#") ? "num" : ""}">${esc(h.replace(/^#/, ""))}</th>`).join("");
  const body = rows.length ? rows.join("") : `<tr><td colspan="${headers.length}" class="muted">none</td></tr>`;
  return `<div class="scroll"><table id="${id}"><thead><tr>${head}</tr></thead><tbody>${body}</tbody></table></div>`;
}
// One short text for an attempt's result; the raw error, when it says more, behind a disclosure.
function errorText(short, raw, cls) {
  const shown = `<span class="${cls || ""}">${esc(short || "—")}</span>`;
  if (!raw || raw === short) return shown;
  return `<details class="raw"><summary>${shown}</summary><code>${esc(raw)}</code></details>`;
}
function statusText(sub) {
  if (sub.last_outcome === "") return '<span class="muted">no attempt yet</span>';
  return `<span class="${sub.last_outcome === "delivered" ? "ok" : "bad"}">${esc(sub.last_error_short)}</span>`;
}

// --- the admin API -----------------------------------------------------------------------------

class AuthNeeded extends Error {}

async function api(path, options = {}) {
  const headers = {};
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) headers["Authorization"] = "Bearer " + token;
  // actions go as JSON: the hub refuses admin actions a cross-site form could send
  if (options.method && options.method !== "GET") {
    headers["Content-Type"] = "application/json";
    options = {...options, body: "{}"};
  }
  const response = await fetch(path, {...options, headers});
  if (response.status === 401) throw new AuthNeeded(await response.text());
  if (!response.ok) throw new Error(`${options.method || "GET"} ${path}: ${response.status} ${await response.text()}`);
  return options.raw ? response.text() : response.json();
}

// What anyone may read when the hub's status needs its admin token: what this hub is, and how a
// subscriber checks its own subscription without an operator.
function landing() {
  const hub = location.origin + "/";
  return `<section class="landing" id="landing">
    <h1>A WebSub hub for ResourceSync change notifications</h1>
    <p>This is an <strong>rsnotify</strong> hub at <code>${esc(hub)}</code>. Sources publish change notifications
      to it; it delivers each one, in order, to every subscriber of the notification's topic.</p>
    <h2>Subscribers</h2>
    <p>Subscribe with a form <code>POST ${esc(hub)}</code>: <code>hub.mode=subscribe</code>, <code>hub.topic</code>,
      <code>hub.callback</code>, and <code>hub.secret</code> for signed deliveries. To see your own subscription
      (state, backlog, last delivery attempts) without asking an operator:</p>
    <ul>
      <li><code>POST ${esc(hub)}diagnostics</code> with <code>hub.topic</code> and <code>hub.callback</code>: the hub
        sends your callback a private link (<code>hub.mode=diagnostics</code>, <code>hub.diagnostics</code>);</li>
      <li>with a secret, <code>GET ${esc(hub)}diagnostics/<var>id</var></code> signed by
        <code>X-Hub-Signature</code> over <var>id</var>, a newline and <code>X-RSNotify-Timestamp</code>
        (<var>id</var>: the first 32 hex digits of sha256(topic, a newline, callback)).</li>
    </ul>
    <p class="muted">The rsnotify subscriber toolkit's <code>diagnostics()</code> does either for you.</p>
    <h2>Operators</h2>
    <form id="token-form">
      <label for="token-input">The status of this hub needs its admin token (<code>RSNOTIFY_ADMIN_TOKEN</code>).</label>
      <div><input id="token-input" type="password" placeholder="admin token" autocomplete="off">
      <button type="submit">Show status</button></div>
      <p id="token-error" class="bad"></p>
    </form>
  </section>`;
}

function askToken(message) {
  clearInterval(timer);
  document.getElementById("search-form").hidden = true;
  main.innerHTML = landing();
  document.getElementById("token-error").textContent = sessionStorage.getItem(TOKEN_KEY) ? message : "";
  document.getElementById("token-form").onsubmit = (event) => {
    event.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, document.getElementById("token-input").value.trim());
    start();
  };
}

function showError(error) {
  const box = document.getElementById("error");
  box.hidden = !error;
  box.textContent = error ? String(error.message || error) : "";
}

async function refresh(render) {
  // a raw error the reader opened stays open across the re-render
  const open = new Set([...main.querySelectorAll("details")].flatMap((d, i) => (d.open ? [i] : [])));
  try {
    await render();
    main.querySelectorAll("details").forEach((d, i) => { if (open.has(i)) d.open = true; });
    showError(null);
    document.getElementById("search-form").hidden = false;
    document.getElementById("updated").textContent = "updated " + new Date().toISOString().slice(11, 19) + " UTC";
  } catch (error) {
    if (error instanceof AuthNeeded) askToken(error.message); else showError(error);
  }
}

// --- the hub: / --------------------------------------------------------------------------------

async function renderOverview() {
  const o = await api("/admin/overview");
  if (!history.rows || Date.now() - history.at > HISTORY_MS) {
    history = {rows: (await api("/admin/history")).history, at: Date.now()};
  }
  document.getElementById("hub-url").textContent = o.hub_url;
  const d = o.deliveries, q = o.queues;
  const states = o.subscriptions_by_state;
  const busiest = o.busiest_topics.map((t) =>
    `<tr><td class="url"><a href="/topics/${esc(t.tid)}">${esc(t.url)}</a></td><td class="num">${num(t.last_hour)}</td>` +
    `<td class="num">${num(t.published)}</td><td class="num">${num(t.subscriptions)}</td></tr>`);
  const trouble = o.trouble.map((s) =>
    `<tr><td class="url"><a href="/subscriptions/${esc(s.sid)}">${esc(s.callback)}</a><div class="muted">${esc(s.topic)}</div></td>` +
    `<td class="problem ${s.attempts || s.dead_letters ? "bad" : "warn"}">${esc(s.problem)}</td>` +
    `<td class="num">${num(s.backlog)}</td><td class="num">${num(s.dead_letters)}</td></tr>`);
  const dormant = o.dormant.map((s) =>
    `<tr><td class="url"><a href="/subscriptions/${esc(s.sid)}">${esc(s.callback)}</a><div class="muted">${esc(s.topic)}</div></td>` +
    `<td>${s.refusing_since ? duration(o.now - s.refusing_since) : "—"}</td><td class="bad">${esc(s.last_error_short)}</td>` +
    `<td class="num">${num(s.backlog)}</td>` +
    `<td><button data-end="${esc(s.sid)}" title="remove it; the subscriber is told (hub.mode=denied)">End</button></td></tr>`);
  const now = o.now;
  const workers = o.workers.map((w) =>
    `<tr><td>${esc(w.name)}</td><td>${esc(w.host)} <span class="muted">pid ${esc(w.pid)}</span></td>` +
    `<td>${w.last_seen ? time(w.last_seen) + ` <span class="muted">(${duration(now - w.last_seen)} ago)</span>` : "—"}</td>` +
    `<td class="num">${w.claims == null ? "—" : num(w.claims)}</td>` +
    `<td>${w.slots == null ? esc(w.state) : `${num(w.slots)} delivery slots · following ${num(w.following)} topic(s)`}</td></tr>`);
  const rep = o.replication;
  const replicas = rep.replicas.map((r) =>
    `<tr><td>${esc(r.address)}</td><td class="${r.state === "online" ? "ok" : "bad"}">${esc(r.state)}</td>` +
    `<td class="num">${num(r.lag_seconds)} s</td><td class="num">${num(r.behind_bytes)}</td></tr>`);
  const failover = rep.last_failover ?
    `last failover ${esc(rep.last_failover.at)}: ${esc(rep.last_failover.from)} → ${esc(rep.last_failover.to)}` : "no failover seen";
  const lat = o.publish_to_delivery_seconds, post = o.delivery_seconds;
  const shown = chartRows(history.rows);
  main.innerHTML = `
    <div class="cards">
      ${card("m-topics", "topics", o.topics)}
      ${card("m-subscriptions", "active subscriptions", states.active)}
      ${card("m-paused", "paused", states.paused, states.paused ? "warn" : "")}
      ${card("m-published-hour", "notifications, last hour", o.published_last_hour)}
      ${card("m-published", "notifications, total", o.published)}
      ${card("m-delivered", "delivered", d.delivered || 0, "ok")}
      ${card("m-retry", "failed attempts (retried)", d.retry || 0, d.retry ? "warn" : "")}
      ${card("m-dead", "dead letters made", d.dead || 0, d.dead ? "bad" : "")}
      ${card("m-gone", "ended by 410 Gone", d.gone || 0)}
      ${card("m-backlog", "backlog", o.backlog, o.backlog ? "warn" : "")}
      ${card("m-trouble", "subscriptions in trouble", o.trouble_count, o.trouble_count ? "bad" : "ok")}
      ${card("m-dormant", "dormant subscriptions", o.dormant_count, o.dormant_count ? "warn" : "")}
      ${card("m-workers", "workers", q.workers, q.workers ? "" : "bad")}
      ${card("m-queued", "jobs queued", q.queued)}
      ${card("m-retries-waiting", "retries waiting", q.waiting_retries)}
    </div>
    <h2>Deliveries per minute and publish→delivery latency, ${esc(shown.title)}</h2>
    <div class="span-choice" id="span-choice">${[["data", "the data's span"], ["60", "1 h"], ["360", "6 h"]].map(([value, label]) =>
      `<button type="button" data-span="${value}" aria-pressed="${chartSpan === value}">${label}</button>`).join("")}</div>
    <div class="charts">
      <div><canvas id="history" width="800" height="200"></canvas>
        <div class="legend muted"><span class="ok">■ delivered</span><span class="bad">■ failed</span>
        <span style="color:#1d4ed8">— average publish→delivery (ms, right axis)</span> · times in UTC</div></div>
      <div><canvas id="minutes" width="400" height="200"></canvas>
        <div class="legend muted">notifications published per minute, last hour</div></div>
    </div>
    <p class="muted">publish→delivery: p50 ≤ <span id="m-p50">${ms(lat.p50)}</span>, p95 ≤ ${ms(lat.p95)}
      · one POST: p50 ≤ ${ms(post.p50)}, p95 ≤ ${ms(post.p95)}
      · verifications: ${Object.entries(o.verifications).map(([k, v]) => esc(k) + " " + num(v)).join(", ") || "none"}</p>
    <h2>Subscriptions in trouble (${num(o.trouble_count)})</h2>
    ${table(["subscriber (callback / topic)", "problem", "#backlog", "#dead letters"], trouble, "trouble")}
    <h2>Dormant subscriptions (${num(o.dormant_count)})</h2>
    <p class="muted">Their callbacks have refused every delivery for more than ${duration(o.dormant_after)}
      (<code>--dormant-after</code>): a Destination that stopped for good, or one resting; End removes the subscription.</p>
    ${table(["subscriber (callback / topic)", "refusing for", "last answer", "#backlog", ""], dormant, "dormant")}
    ${o.subscriptions_scanned < o.subscriptions ? `<p class="muted">Trouble is looked for among the
      ${num(o.subscriptions_scanned)} subscriptions whose leases end first (of ${num(o.subscriptions)}).</p>` : ""}
    <h2>Busiest topics (last hour)</h2>
    ${table(["topic", "#last hour", "#published", "#subscriptions"], busiest, "busiest")}
    <h2>Workers (${num(o.workers.length)})</h2>
    ${table(["worker", "host", "last seen", "#claims", "lanes"], workers, "workers")}
    <h2>Redis</h2>
    <p>primary <span id="redis-primary">${esc(rep.primary)}</span>${rep.sentinel ? " (found through Sentinel)" : ""}
      · publishes wait for ${num(rep.min_replicas)} replica(s) · <span id="redis-failover">${failover}</span></p>
    ${table(["replica", "state", "lag", "#bytes behind"], replicas, "replicas")}`;
  drawHistory(document.getElementById("history"), shown.rows);
  drawBars(document.getElementById("minutes"), o.published_per_minute);
  main.querySelectorAll("#span-choice button").forEach((button) => {
    button.onclick = () => { chartSpan = button.dataset.span; refresh(renderOverview); };
  });
  main.querySelectorAll("#dormant button[data-end]").forEach((button) => {
    button.onclick = () => endSubscription(button.dataset.end, () => renderOverview());
  });
}

// The rows the chart shows: the last hour or six, or from the minute before the first one with any
// activity (at least 3 minutes), so a young hub's data is not squeezed into the axis's end.
function chartRows(rows) {
  if (chartSpan !== "data") {
    const minutes = Number(chartSpan);
    return {rows: rows.slice(-minutes), title: minutes === 60 ? "last hour" : "last 6 hours"};
  }
  const first = rows.findIndex((r) => r.delivered || r.failed || r.latency_ms != null);
  if (first < 0) return {rows: rows.slice(-60), title: "last hour (nothing yet)"};
  const start = Math.max(0, Math.min(first - 1, rows.length - 3));
  const from = new Date(rows[start].minute * 1000).toISOString().slice(11, 16);
  return {rows: rows.slice(start), title: `since ${from} UTC (the data's span)`};
}

// DELETE through the admin API (JSON, the admin token): the hub tells the subscriber.
function endSubscription(sid, then) {
  const reason = prompt("End this subscription? The subscriber gets hub.mode=denied with this reason:",
                        "the hub's operator ended this subscription: its callback refused every delivery");
  if (reason === null) return;
  refresh(async () => {
    await api("/admin/subscriptions/" + encodeURIComponent(sid) + "?reason=" + encodeURIComponent(reason), {method: "DELETE"});
    await then();
  });
}

// The server keeps one row per minute (store/history.py), so the chart is full as soon as it opens.
function fitCanvas(canvas) {      // draw at the element's own size, so labels keep their size on a phone
  const ratio = window.devicePixelRatio || 1, w = canvas.clientWidth || canvas.width, h = canvas.clientHeight || canvas.height;
  canvas.width = Math.round(w * ratio); canvas.height = Math.round(h * ratio);
  const ctx = canvas.getContext("2d");
  ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
  return [ctx, w, h];
}

function drawHistory(canvas, rows) {
  const [ctx, w, h] = fitCanvas(canvas), pad = 34;
  ctx.clearRect(0, 0, w, h);
  const top = Math.max(1, ...rows.map((r) => r.delivered + r.failed));
  const latTop = Math.max(1, ...rows.map((r) => r.latency_ms || 0));
  const bw = (w - 2 * pad) / Math.max(1, rows.length);
  const y = (v, scale) => h - pad - (h - 2 * pad) * (v / scale);
  rows.forEach((r, i) => {
    const x = pad + i * bw;
    ctx.fillStyle = "#067647";
    ctx.fillRect(x, y(r.delivered, top), Math.max(1, bw), h - pad - y(r.delivered, top));
    ctx.fillStyle = "#b42318";
    ctx.fillRect(x, y(r.delivered + r.failed, top), Math.max(1, bw), y(r.delivered, top) - y(r.delivered + r.failed, top));
  });
  ctx.strokeStyle = "#1d4ed8"; ctx.lineWidth = 1.5; ctx.beginPath();
  let started = false;
  rows.forEach((r, i) => {
    if (r.latency_ms == null) { started = false; return; }
    const x = pad + (i + 0.5) * bw, yy = y(r.latency_ms, latTop);
    if (started) ctx.lineTo(x, yy); else { ctx.moveTo(x, yy); started = true; }
  });
  ctx.stroke();
  ctx.fillStyle = "#1d4ed8";    // a dot per minute too, so a lone minute shows
  rows.forEach((r, i) => { if (r.latency_ms != null) ctx.fillRect(pad + (i + 0.5) * bw - 1.5, y(r.latency_ms, latTop) - 1.5, 3, 3); });
  ctx.fillStyle = "#6b7280"; ctx.font = "11px sans-serif";
  ctx.fillText(num(top) + "/min", 2, pad - 8);
  ctx.fillText(latTop.toFixed(0) + " ms", w - pad - 10, pad - 8);
  ctx.strokeStyle = "#e5e7eb"; ctx.beginPath(); ctx.moveTo(pad, h - pad); ctx.lineTo(w - pad, h - pad); ctx.stroke();
  // a tick and its UTC time every `step` minutes, the smallest step that keeps labels 44 px apart
  const step = [5, 10, 15, 30, 60, 120, 180].find((m) => m * bw >= 44) || 360;
  const label = (r, i) => {
    const x = pad + i * bw;
    ctx.fillStyle = "#6b7280"; ctx.fillRect(x, h - pad, 1, 4);
    ctx.fillText(new Date(r.minute * 1000).toISOString().slice(11, 16), x - 14, h - pad + 16);
  };
  const ticks = rows.filter((r) => r.minute % (step * 60) === 0);
  rows.forEach((r, i) => { if (r.minute % (step * 60) === 0) label(r, i); });
  if (!ticks.length && rows.length) {   // a span shorter than one step: its first and last minute
    label(rows[0], 0);
    if (rows.length > 1) label(rows[rows.length - 1], rows.length - 1);
  }
  if (!rows.some((r) => r.delivered || r.failed)) ctx.fillText("no deliveries in this time", pad + 8, h / 2);
}

function drawBars(canvas, values) {
  const [ctx, w, h] = fitCanvas(canvas), pad = 20;
  ctx.clearRect(0, 0, w, h);
  const top = Math.max(1, ...values), bw = (w - 2 * pad) / values.length;
  ctx.fillStyle = "#1d4ed8";
  values.forEach((v, i) => {
    const bh = (h - 2 * pad) * (v / top);
    ctx.fillRect(pad + i * bw, h - pad - bh, Math.max(1, bw - 1), bh);
  });
  ctx.fillStyle = "#6b7280"; ctx.font = "11px sans-serif";
  ctx.fillText(String(top), 2, pad - 6);
  ctx.fillText("-60 min", pad, h - 4); ctx.fillText("now", w - pad - 18, h - 4);
}

// --- one topic: /topics/{tid} --------------------------------------------------------------------

async function renderTopic(tid) {
  const t = await api("/admin/topics/" + encodeURIComponent(tid));
  const now = Date.now() / 1000;
  const subs = t.subscriptions_list.map((s) =>
    `<tr><td class="url"><a href="/subscriptions/${esc(s.sid)}">${esc(s.callback)}</a></td><td>${esc(s.state)}</td>` +
    `<td class="num">${num(s.backlog)}</td><td class="num">${num(s.delivered)}</td><td>${statusText(s)}</td>` +
    `<td class="${s.dormant ? "bad" : "warn"}">${esc(s.problem)}</td></tr>`);
  const recent = t.recent_notifications.map((n) =>
    `<tr><td class="num">${num(n.sequence)}</td><td>${bodyLink("/admin/topics/" + t.tid + "/notifications/" + n.notification_id,
       n.notification_id)}</td><td>${time(n.published_ms / 1000)}</td>` +
    `<td class="num">${n.changes == null ? "—" : num(n.changes)}</td>` +
    `<td class="when">${esc(n.from ?? "—")}</td><td class="when">${esc(n.until ?? "—")}</td>` +
    `<td class="num">${num(n.bytes)}</td></tr>`);
  main.innerHTML = `
    <h1>${esc(t.url)}</h1>
    <div class="cards">
      ${card("t-published", "notifications published", t.published)}
      ${card("t-log", "kept in the log", t.log_length)}
      ${card("t-subscriptions", "subscriptions", t.subscriptions)}
    </div>
    <p class="muted">topic id ${esc(t.tid)} · known since ${time(t.created)} · last publish ${
      t.last_published_ms ? duration(now - t.last_published_ms / 1000) + " ago" : "never"}</p>
    <h2>Subscriptions</h2>
    ${table(["callback", "state", "#backlog", "#delivered", "last status", "trouble"], subs, "subscriptions")}
    <h2>Recent notifications</h2>
    ${table(["#seq", "notification id", "published", "#changes", "from", "until", "#bytes"], recent, "recent")}`;
}

// --- one subscription: /subscriptions/{sid} -----------------------------------------------------

async function renderSubscription(sid) {
  const s = await api("/admin/subscriptions/" + encodeURIComponent(sid));
  const kv = [
    ["callback", esc(s.callback)], ["topic", `<a href="/topics/${esc(s.tid)}">${esc(s.topic)}</a>`],
    ["state", `<span id="s-state" class="${s.state === "active" ? "ok" : "warn"}">${esc(s.state)}</span>`],
    ["lease", `ends ${time(s.expires)} (${s.expires_in >= 0 ? "in " + duration(s.expires_in) : "ended"}), ` +
              `${duration(s.lease_seconds)} granted`],
    ["signed deliveries", s.has_secret ? "yes (secret set)" : "no secret"],
    ["backlog", `<span id="s-backlog">${num(s.backlog)}</span> notification(s) not confirmed yet`],
    ["delivered", `<span id="s-delivered">${num(s.delivered)}</span>`],
    ["replayed", `<span id="s-replayed">${num(s.replayed)}</span> log entries re-sent for rsnotify.replay_from` +
        (s.replay_max < 0 ? "" : s.replay_max === 0 ? " (replay is off)" : ` (at most ${num(s.replay_max)})`)],
    ["last attempt", s.last_attempt_at ? `${time(s.last_attempt_at)} · ${esc(s.last_outcome)} · ` +
        `${Number(s.last_latency_ms).toFixed(1)} ms · ` +
        errorText(s.last_error_short, s.last_error, s.last_outcome === "delivered" ? "ok" : "bad") : "none yet"],
    ["retrying", s.attempts ? `<span class="warn">${s.attempts} failed attempt(s); next ${time(s.next_attempt)}</span>` : "no"],
    ["missed (left the log)", s.gaps ? `<span class="bad">${num(s.gaps)} (last ${esc(s.last_gap)})</span>` : "none"],
    ["trouble", (s.dormant ? `<div class="bad" id="s-dormant">${esc(s.problem)}</div>` : "") +
        (s.trouble.length ? s.trouble.map((r) => `<div class="warn">${esc(r)}</div>`).join("") : '<span class="ok">none</span>')],
  ].map(([k, v]) => `<tr><th>${esc(k)}</th><td>${v}</td></tr>`);
  const attempts = s.attempts_recent.map((a) =>
    `<tr><td>${time(a.at)}</td><td class="num">${num(a.sequence)}</td>` +
    `<td>${bodyLink("/admin/topics/" + s.tid + "/notifications/" + a.notification_id, a.notification_id)}</td>` +
    `<td class="${a.outcome === "delivered" ? "ok" : "bad"}">${esc(a.outcome)}</td>` +
    `<td class="num">${Number(a.latency_ms).toFixed(1)} ms</td>` +
    `<td>${a.outcome === "delivered" ? '<span class="ok">—</span>' : errorText(a.error_short, a.error, "bad")}</td></tr>`);
  const dead = s.dead_letters_list.map((d) =>
    `<tr><td class="num">${num(d.sequence)}</td>` +
    `<td>${bodyLink("/admin/subscriptions/" + s.sid + "/dead-letters/" + d.notification_id, d.notification_id)}</td>` +
    `<td>${num(d.attempts)}</td>` +
    `<td>${errorText(d.error_short, d.error, "bad")}</td><td>${time(d.dead_at)}</td>` +
    `<td>${d.resend ? "queued" : `<button data-resend="${esc(d.notification_id)}">Re-send</button>`}</td></tr>`);
  main.innerHTML = `
    <h1>${esc(s.callback)}</h1>
    <div class="actions">
      ${s.state === "paused" ? '<button id="resume">Resume</button>' : '<button id="pause">Pause</button>'}
      ${s.attempts && s.state !== "paused" ? '<button id="retry">Retry now</button>' : ""}
      <button id="resend-all" ${s.dead_letters ? "" : "disabled"}>Re-send all dead letters (${num(s.dead_letters)})</button>
      <button id="remove">Remove (tells the subscriber)</button>
    </div>
    <h2>Subscription ${esc(s.sid)}</h2>
    <table class="kv">${kv.join("")}</table>
    <h2>Last delivery attempts</h2>
    ${table(["time", "#seq", "notification id", "outcome", "#latency", "answer"], attempts, "attempts")}
    <h2>Dead letters (${num(s.dead_letters)})</h2>
    ${table(["#seq", "notification id", "attempts", "last answer", "dead since", ""], dead, "dead-letters")}`;
  const act = (method, path) => refresh(async () => { await api(path, {method}); await renderSubscription(sid); });
  const base = "/admin/subscriptions/" + encodeURIComponent(sid);
  const on = (id, handler) => { const el = document.getElementById(id); if (el) el.onclick = handler; };
  on("pause", () => act("POST", base + "/pause"));
  on("resume", () => act("POST", base + "/resume"));
  on("retry", () => act("POST", base + "/retry"));
  on("resend-all", () => act("POST", base + "/dead-letters/resend"));
  on("remove", () => {
    const reason = prompt("Remove this subscription? The subscriber gets hub.mode=denied with this reason:",
                          "the hub's operator removed this subscription");
    if (reason === null) return;
    refresh(async () => {
      await api(base + "?reason=" + encodeURIComponent(reason), {method: "DELETE"});
      clearInterval(timer);
      main.innerHTML = `<p>Subscription removed; the subscriber is being told. <a href="/topics/${esc(s.tid)}">Back to the topic</a></p>`;
    });
  });
  main.querySelectorAll("button[data-resend]").forEach((button) => {
    button.onclick = () => act("POST", base + "/dead-letters/" + encodeURIComponent(button.dataset.resend) + "/resend");
  });
}

// --- notification bodies and search (outside #main, so the next poll does not wipe them) ---------

function bodyLink(path, nid) {
  return `<a href="${esc(path)}" data-body="${esc(path)}" title="show this notification's body">${esc(nid)}</a>`;
}

// A click shows the body below (fetched with the admin token; the API serves it as a download).
document.addEventListener("click", async (event) => {
  const link = event.target.closest("a[data-body]");
  if (!link) return;
  event.preventDefault();
  const view = document.getElementById("body-view");
  try {
    const text = await api(link.dataset.body, {raw: true});
    view.querySelector("h2").textContent = "Notification " + link.textContent;
    view.querySelector("pre").textContent = text;
    view.hidden = false;
    view.scrollIntoView({block: "nearest"});
  } catch (error) {
    if (error instanceof AuthNeeded) askToken(error.message); else showError(error);
  }
});

async function search(text) {
  const box = document.getElementById("search-results");
  if (!text) { box.hidden = true; box.innerHTML = ""; return; }
  const q = encodeURIComponent(text);
  const [subs, topics] = await Promise.all([api(`/admin/subscriptions?search=${q}&limit=50`),
                                            api(`/admin/topics?search=${q}&limit=50`)]);
  const topicRows = topics.topics.map((t) =>
    `<tr><td class="url"><a href="/topics/${esc(t.tid)}">${esc(t.url)}</a></td><td class="num">${num(t.published)}</td>` +
    `<td class="num">${num(t.subscriptions)}</td></tr>`);
  const subRows = subs.subscriptions.map((s) =>
    `<tr><td class="url"><a href="/subscriptions/${esc(s.sid)}">${esc(s.callback)}</a><div class="muted">${esc(s.topic)}</div></td>` +
    `<td>${esc(s.state)}</td><td class="warn">${esc(s.problem) || '<span class="ok">fine</span>'}</td></tr>`);
  box.innerHTML = `<h2>Search “${esc(text)}”: ${num(topics.total)} topic(s), ${num(subs.total)} subscription(s)
      <button id="search-clear" type="button">Clear</button></h2>
    ${table(["topic", "#published", "#subscriptions"], topicRows, "search-topics")}
    ${table(["subscriber (callback / topic)", "state", "problem"], subRows, "search-subscriptions")}`;
  box.hidden = false;
  document.getElementById("search-clear").onclick = () => {
    document.getElementById("search-input").value = "";
    search("");
  };
}

document.getElementById("search-form").onsubmit = (event) => {
  event.preventDefault();
  const text = document.getElementById("search-input").value.trim();
  search(text).catch((error) => (error instanceof AuthNeeded ? askToken(error.message) : showError(error)));
};
document.getElementById("body-close").onclick = () => { document.getElementById("body-view").hidden = true; };

// --- routing -------------------------------------------------------------------------------------

function start() {
  const path = location.pathname;
  let render;
  let match;
  if ((match = path.match(/^\/topics\/([0-9a-f]{32})$/))) render = () => renderTopic(match[1]);
  else if ((match = path.match(/^\/subscriptions\/([0-9a-f]{32})$/))) render = () => renderSubscription(match[1]);
  else render = renderOverview;
  clearInterval(timer);
  refresh(render);
  // the subscription page holds buttons: refresh it less often so a click is not raced
  timer = setInterval(() => refresh(render), path.startsWith("/subscriptions/") ? 3 * POLL_MS : POLL_MS);
}

start();
