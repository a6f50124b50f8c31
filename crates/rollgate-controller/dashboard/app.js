// rollgate's dashboard: a page over the admin API, nothing else. Every
// number it shows comes from /api/v1 with the caller's own token, so it
// can see and do exactly what the token's role may. No framework and no
// build step: the three files are embedded in the controller's binary.

const params = new URLSearchParams(location.search);
const REFRESH_MS = Math.max(250, Number(params.get("refresh")) || 1000);
const TOKEN_KEY = "rollgate.token";

let me = null; // {name, role, rollout_actions}

// --- the API ---------------------------------------------------------------

class ApiError extends Error {
  constructor(status, code, message) { super(message); this.status = status; this.code = code; }
}

async function api(path, init = {}) {
  const headers = { Accept: "application/json", ...(init.headers || {}) };
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) headers.Authorization = `Bearer ${token}`;
  if (init.body !== undefined) headers["Content-Type"] = "application/json";
  const resp = await fetch(path, { ...init, headers });
  const text = await resp.text();
  let body = null;
  try { body = text ? JSON.parse(text) : null; } catch { body = null; }
  if (!resp.ok) {
    const e = body && body.error ? body.error : { code: String(resp.status), message: text || resp.statusText };
    throw new ApiError(resp.status, e.code, e.message);
  }
  return body;
}

// --- DOM helpers: text is always set as text, never parsed as HTML ----------

function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) {
    if (c === undefined || c === null || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

const SVG = "http://www.w3.org/2000/svg";
function s(tag, attrs = {}, text) {
  const el = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, String(v));
  if (text !== undefined) el.textContent = text;
  return el;
}

const time = (ms) => new Date(ms).toLocaleString();

function phaseName(p) {
  if (p.phase === "canary") return `CANARY ${p.weight_percent}%`;
  return p.phase.toUpperCase();
}
function phaseBadge(p, paused, dryRun) {
  const badge = h("span", { class: `badge phase-${p.phase}`, "data-phase": p.phase },
    phaseName(p) + (paused ? " (paused)" : ""));
  return dryRun ? h("span", {}, badge, " ", h("span", { class: "badge dry-run", "data-dry-run": "" }, "DRY RUN")) : badge;
}
// Watching after promotion, the candidate serves everyone and the mirror
// goes to the previous champion.
const routingWords = (r) => r.state.phase.phase === "watching"
  ? `candidate 100% live (promoted, watched), previous champion ${r.spec.champion} ${r.routing.mirror_bp / 100}% mirrored`
  : `candidate ${r.routing.candidate_weight_bp / 100}% live, ${r.routing.mirror_bp / 100}% mirrored`;
const ended = (p) => ["promoted", "rolled_back", "aborted"].includes(p.phase);
const approvalPoint = (a) => (a === "promotion" ? "promotion" : `${a}%`);

// --- views ----------------------------------------------------------------

async function overview() {
  const [live, models, leader] = await Promise.all([
    api("/api/v1/rollouts?active=true&limit=1000"),
    api("/api/v1/models?limit=1000"),
    api("/api/v1/leader").catch(() => null),
  ]);
  // Behind: the controller looks at each rollout less often than its tick.
  const cadence = leader && leader.this.leading ? leader.cadence : null;
  const behind = cadence && cadence.lag_seconds > 1.5 * cadence.tick_seconds
    ? h("p", { class: "warning", id: "lag", "data-lag": cadence.lag_seconds.toFixed(1) },
      `The controller is behind: a rollout waited ${cadence.lag_seconds.toFixed(1)} s between looks ` +
      `(tick ${cadence.tick_seconds} s). Decisions come that much later.`)
    : null;
  const liveRows = live.map((r) => h("tr", {},
    h("td", {}, h("a", { href: `#/rollouts/${r.id}` }, `#${r.id}`)),
    h("td", {}, h("a", { href: `#/models/${encodeURIComponent(r.model)}` }, r.model)),
    h("td", {}, `${r.champion} → ${r.candidate}`),
    h("td", {}, phaseBadge(r.phase, r.paused, r.dry_run)),
    h("td", {}, `${r.weight_percent}%`),
    h("td", {}, String(r.evaluations))));
  const modelRows = models.map((m) => h("tr", {},
    h("td", {}, h("a", { href: `#/models/${encodeURIComponent(m.name)}`, "data-model": m.name }, m.name)),
    h("td", {}, m.champion ?? h("span", { class: "muted" }, "none"))));
  return [
    h("h1", {}, "Overview"),
    behind,
    h("section", { id: "live" }, h("h2", {}, "Live rollouts"),
      liveRows.length ? h("table", {}, h("tr", {}, ["Rollout", "Model", "Champion → candidate", "Phase", "Weight", "Evaluations"].map((t) => h("th", {}, t))), liveRows)
        : h("p", { class: "muted" }, "No rollout is running.")),
    h("section", { id: "models" }, h("h2", {}, "Models"),
      h("table", {}, h("tr", {}, h("th", {}, "Model"), h("th", {}, "Champion")), modelRows)),
  ];
}

async function modelView(name) {
  const enc = encodeURIComponent(name);
  const [model, revisions, rollouts] = await Promise.all([
    api(`/api/v1/models/${enc}`),
    api(`/api/v1/models/${enc}/revisions?limit=1000`),
    api(`/api/v1/rollouts?model=${enc}&limit=1000`),
  ]);
  const revRows = revisions.map((r) => h("tr", {},
    h("td", {}, r.id),
    h("td", {}, h("span", { class: `badge state-${r.state}` }, r.state)),
    h("td", {}, String(r.rejections)),
    h("td", {}, r.blocked ? h("span", { class: "fail" }, "blocked") : ""),
    h("td", {}, r.blocked && me && me.role === "admin"
      ? reasonAction("unblock", `/api/v1/revisions/${encodeURIComponent(r.id)}/unblock`, `Unblock ${r.id}`) : "")));
  const rollRows = rollouts.map((r) => h("tr", {},
    h("td", {}, h("a", { href: `#/rollouts/${r.id}`, "data-rollout": r.id }, `#${r.id}`)),
    h("td", {}, `${r.champion} → ${r.candidate}`),
    h("td", {}, phaseBadge(r.phase, r.paused, r.dry_run)),
    h("td", {}, r.phase.reason ? r.phase.reason.code.replaceAll("_", " ") : ""),
    h("td", {}, time(r.updated_at))));
  return [
    h("h1", {}, `Model ${model.name}`),
    h("section", {}, h("h2", {}, "Champion"), h("p", {}, model.champion ?? "none")),
    h("section", { id: "rollouts" }, h("h2", {}, "Rollouts"),
      rollRows.length ? h("table", {}, h("tr", {}, ["Rollout", "Champion → candidate", "Phase", "Why it ended", "Updated"].map((t) => h("th", {}, t))), rollRows)
        : h("p", { class: "muted" }, "No rollouts yet.")),
    h("section", { id: "revisions" }, h("h2", {}, "Revisions"),
      h("table", {}, h("tr", {}, ["Revision", "State", "Rejections", "", ""].map((t) => h("th", {}, t))), revRows)),
  ];
}

/// A button that asks for a reason, then posts it.
function reasonAction(verb, path, label, danger = false) {
  const wrap = h("span", { class: "actions" });
  const open = h("button", { class: danger ? "danger" : "", "data-action": verb, onclick: () => {
    const input = h("input", { placeholder: "reason (recorded in the audit log)", "data-reason": verb, required: true });
    const go = h("button", { class: "danger", "data-confirm": verb, onclick: async () => {
      if (!input.value.trim()) { input.focus(); return; }
      go.disabled = true;
      try { await api(path, { method: "POST", body: JSON.stringify({ reason: input.value }) }); }
      catch (e) { showError(e); }
      await refresh(true);
    } }, `Confirm ${verb}`);
    wrap.replaceChildren(input, go, h("button", { onclick: () => refresh(true) }, "Cancel"));
    input.focus();
  } }, label);
  wrap.append(open);
  return wrap;
}

function actionBar(r) {
  const may = new Set(me ? me.rollout_actions : []);
  const st = r.state;
  if (ended(st.phase) || may.size === 0) return null;
  const path = (v) => `/api/v1/rollouts/${r.id}/${v}`;
  const post = (v) => async () => {
    try { await api(path(v), { method: "POST", body: "{}" }); } catch (e) { showError(e); }
    await refresh(true);
  };
  const items = [];
  if (st.awaiting && may.has("approve"))
    items.push(reasonAction("approve", path("approve"), `Approve ${approvalPoint(st.awaiting.before)}`));
  if (!st.paused && may.has("pause")) items.push(h("button", { "data-action": "pause", onclick: post("pause") }, "Pause"));
  if (st.paused && may.has("resume")) items.push(h("button", { "data-action": "resume", onclick: post("resume") }, "Resume"));
  if (may.has("abort")) items.push(reasonAction("abort", path("abort"), "Abort", true));
  if (may.has("promote")) items.push(reasonAction("promote", path("promote"), "Promote now"));
  return h("section", { id: "actions" }, h("h2", {}, "Actions"), h("div", { class: "actions" }, items));
}

/// A number for reading: three significant digits, powers of ten beyond.
function round(n) {
  if (!isFinite(n)) return String(n);
  if (n === 0) return "0";
  return Math.abs(n) >= 1e4 || Math.abs(n) < 1e-3 ? n.toExponential(1).replace(".0e", "e").replace("e+", "e") : String(Number(n.toPrecision(3)));
}

/// Elapsed milliseconds as people say them: `2.5 s`, `45 s`, `3 min`, `1 h 10 min`.
function elapsed(ms) {
  const s = ms / 1000;
  if (s < 10) return `${Number(s.toFixed(1))} s`;
  if (s < 120) return `${Math.round(s)} s`;
  const m = Math.round(s / 60);
  if (m < 120) return s % 60 >= 1 && m < 10 ? `${Math.floor(s / 60)} min ${Math.round(s % 60)} s` : `${m} min`;
  return `${Math.floor(m / 60)} h${m % 60 ? ` ${m % 60} min` : ""}`;
}

/// Ticks every round step (1, 2, 5 × 10^k ms, then minutes and hours), at most about six.
function timeTicks(span) {
  const steps = [100, 200, 500, 1e3, 2e3, 5e3, 1e4, 15e3, 3e4, 6e4, 12e4, 3e5, 6e5, 9e5, 18e5, 36e5, 72e5, 144e5, 216e5, 864e5];
  const step = steps.find((st) => span / st <= 6) ?? Math.ceil(span / 6);
  const ticks = [];
  for (let t = 0; t <= span + 1e-9 && ticks.length < 50; t += step) ticks.push(t);
  return ticks;
}

/// The axes of a plot over elapsed time since `t0`: a log axis shows
/// decades (1, 10, 100, …), a linear one three round values.
function frame(svg, { W, H, L, R, T, B }, t0, t1, log, lo, hi, y) {
  svg.append(s("line", { class: "axis", x1: L, y1: H - B, x2: W - R, y2: H - B }), s("line", { class: "axis", x1: L, y1: T, x2: L, y2: H - B }));
  const x = (t) => L + ((t - t0) / (t1 - t0)) * (W - L - R);
  for (const dt of timeTicks(t1 - t0)) {
    svg.append(s("line", { class: "tick", x1: x(t0 + dt), y1: H - B, x2: x(t0 + dt), y2: H - B + 3 }),
      s("text", { class: "xtick", x: x(t0 + dt), y: H - 4, "text-anchor": "middle" }, elapsed(dt)));
  }
  let values;
  if (log) {
    const [a, b] = [Math.ceil(lo), Math.floor(hi)];
    const every = Math.max(1, Math.ceil((b - a + 1) / 6));
    values = [];
    for (let d = a; d <= b; d += every) values.push(10 ** d);
    if (!values.length) values = [10 ** lo, 10 ** hi].map((v) => Number(v.toPrecision(2)));
  } else {
    values = [lo, (lo + hi) / 2, hi].map((v) => Number(v.toPrecision(2)));
  }
  for (const v of values) {
    svg.append(s("line", { class: "grid", x1: L, y1: y(v), x2: W - R, y2: y(v) }),
      s("text", { class: "ytick", x: L - 4, y: y(v) + 4, "text-anchor": "end" }, round(v)));
  }
  return x;
}

/// One gate's measure over the rollout: its bound (band), its value
/// (line), the limit it is judged by (dashed), failing looks (red dots),
/// and the stage changes (grey marks); e-values on a log axis.
function plot(series, t0, t1, marks) {
  const box = { W: 600, H: 200, L: 56, R: 8, T: 12, B: 22 };
  const { W, H, L, R, T, B } = box;
  const pts = series.points;
  const svg = s("svg", { class: "plot", viewBox: `0 0 ${W} ${H}`, role: "img", "data-scale": series.log ? "log" : "linear", "aria-label": `${series.gate}: ${series.measure}` });
  if (!pts.length) return svg;
  const ys = [];
  for (const p of pts) for (const k of ["value", "lower", "upper", "limit"]) if (p[k] !== undefined && p[k] !== null && isFinite(p[k]) && (!series.log || p[k] > 0)) ys.push(p[k]);
  if (!ys.length) return svg;
  const f = series.log ? (v) => Math.log10(Math.max(v, 1e-12)) : (v) => v;
  let lo = Math.min(...ys.map(f)), hi = Math.max(...ys.map(f));
  if (hi - lo < 1e-9) { hi += 1; lo -= series.log ? 1 : 0; }
  const pad = (hi - lo) * 0.05; lo -= pad; hi += pad;
  // (A value off a log axis, e.g. an e-value that underflowed to 0, sits on its floor.)
  const y = (v) => T + (1 - (Math.min(Math.max(f(v), lo), hi) - lo) / (hi - lo)) * (H - T - B);
  const x = frame(svg, box, t0, t1, series.log, lo, hi, y);
  const band = pts.filter((p) => p.lower != null && p.upper != null);
  if (band.length > 1) {
    const up = band.map((p) => `${x(p.at).toFixed(1)},${y(p.upper).toFixed(1)}`);
    const down = band.slice().reverse().map((p) => `${x(p.at).toFixed(1)},${y(p.lower).toFixed(1)}`);
    svg.append(s("polygon", { class: "band", points: up.concat(down).join(" ") }));
  }
  const line = (key, cls) => {
    const ps = pts.filter((p) => p[key] != null && isFinite(p[key]));
    if (ps.length) svg.append(s("polyline", { class: cls, points: ps.map((p) => `${x(p.at).toFixed(1)},${y(p[key]).toFixed(1)}`).join(" ") }));
  };
  line(pts.some((p) => p.value != null) ? "value" : "upper", "value");
  line("limit", "limit");
  const lastLimit = [...pts].reverse().find((p) => p.limit != null);
  if (lastLimit) svg.append(s("text", { x: W - R - 4, y: y(lastLimit.limit) - 3, "text-anchor": "end", class: "limit-label" }, `${series.log ? "fails at" : "limit"} ${round(lastLimit.limit)}`));
  for (const m of marks) if (m.at >= t0 && m.at <= t1) {
    svg.append(s("line", { class: "mark", x1: x(m.at), y1: T, x2: x(m.at), y2: H - B }), s("text", { x: x(m.at) + 2, y: T + 8 }, m.label));
  }
  if (pts.length < 60) for (const p of pts) {
    const v = p.value ?? p.upper;
    if (v != null && isFinite(v)) svg.append(s("circle", { class: "pt", cx: x(p.at), cy: y(v), r: 2 }));
  }
  for (const p of pts) if (p.outcome === "fail") {
    const v = p.value ?? (series.fails === "below" ? p.upper : p.lower);
    if (v != null) svg.append(s("circle", { class: "failpt", cx: x(p.at), cy: y(v), r: 3 }));
  }
  return svg;
}

/// Both arms' own values side by side (rates, latency): the candidate's
/// line beside the champion's, on one axis.
function armsPlot(series, t0, t1) {
  const pts = series.points.filter((p) => p.arms);
  if (!pts.length) return null;
  const box = { W: 600, H: 150, L: 56, R: 8, T: 18, B: 22 };
  const { W, H, T, B } = box;
  const measure = pts[pts.length - 1].arms.measure;
  const svg = s("svg", { class: "plot arms", viewBox: `0 0 ${W} ${H}`, role: "img", "data-scale": "linear", "aria-label": `${series.gate}: ${measure}, candidate and champion` });
  const ys = pts.flatMap((p) => [p.arms.candidate, p.arms.champion]).filter(isFinite);
  if (!ys.length) return null;
  let lo = Math.min(0, ...ys), hi = Math.max(...ys);
  if (hi - lo < 1e-9) hi = lo + 1;
  hi += (hi - lo) * 0.05;
  const y = (v) => T + (1 - (v - lo) / (hi - lo)) * (H - T - B);
  const x = frame(svg, box, t0, t1, false, lo, hi, y);
  for (const arm of ["champion", "candidate"]) {
    svg.append(s("polyline", { class: `arm ${arm}`, points: pts.map((p) => `${x(p.at).toFixed(1)},${y(p.arms[arm]).toFixed(1)}`).join(" ") }));
    if (pts.length < 60) for (const p of pts) svg.append(s("circle", { class: `armpt ${arm}`, cx: x(p.at), cy: y(p.arms[arm]), r: 2 }));
  }
  const last = pts[pts.length - 1].arms;
  svg.append(s("text", { class: "legend candidate", x: 60, y: 12 }, `candidate ${round(last.candidate)}`),
    s("text", { class: "legend champion", x: 220, y: 12 }, `champion ${round(last.champion)}`),
    s("text", { x: W - 8, y: 12, "text-anchor": "end" }, measure));
  return svg;
}

async function rolloutView(id) {
  const [r, tl] = await Promise.all([
    api(`/api/v1/rollouts/${id}`),
    api(`/api/v1/rollouts/${id}/timeline?points=600`),
  ]);
  const st = r.state;
  const marks = tl.events.filter((e) => e.kind === "advanced" || e.kind === "started")
    .map((e) => ({ at: e.at, label: e.to || e.kind }));
  const current = new Map((st.last_verdict ? st.last_verdict.gates : []).map((g) => [g.gate, g.outcome]));
  // Elapsed time since the rollout began, to its last evaluation or decision.
  const t0 = r.created_at;
  const t1 = Math.max(t0 + 1000, ...tl.events.map((e) => e.at), ...tl.gates.flatMap((g) => g.points.map((p) => p.at)));
  const gates = tl.gates.map((g) => {
    const last = g.points[g.points.length - 1];
    const outcome = ended(st.phase) ? last.outcome : (current.get(g.gate) ?? last.outcome);
    return h("section", { class: "gate", "data-gate": g.gate },
      h("h2", {}, h("span", {}, g.gate.replaceAll("_", " ")), h("span", { class: outcome }, outcome.toUpperCase())),
      h("div", { class: "muted" }, `${g.measure}; ${g.fails === "above" ? "fails above" : "fails below"} the dashed limit`),
      plot(g, t0, t1, marks),
      armsPlot(g, t0, t1));
  });
  const awaiting = st.awaiting
    ? h("p", { id: "awaiting", class: "wait" }, `Waiting for an operator (role operator or admin) to approve ${approvalPoint(st.awaiting.before)} since ${time(st.awaiting.since)}` + (st.awaiting.deadline_passed ? " — its deadline has passed; holding." : "."))
    : null;
  return [
    h("h1", {}, `Rollout #${r.id} of `, h("a", { href: `#/models/${encodeURIComponent(r.spec.model)}` }, r.spec.model), " ", phaseBadge(st.phase, st.paused, r.spec.plan.mode === "observe")),
    h("section", { id: "why" },
      h("p", { class: "why", "data-phase-line": "" }, tl.phase_line),
      tl.outcome_lines.map((l) => h("p", {}, l)),
      awaiting,
      h("p", { class: "muted" }, `${r.spec.champion} → ${r.spec.candidate}; policy ${r.spec.plan.policy}; ${tl.evaluations} evaluations (${tl.recorded} recorded); routing: ${routingWords(r)}`)),
    actionBar(r),
    h("section", { id: "verdict" }, h("h2", {}, ended(st.phase) ? "The deciding verdict" : "The latest verdict"),
      tl.last_verdict.length ? h("pre", { class: "lines" }, tl.last_verdict.join("\n")) : h("p", { class: "muted" }, "No verdict yet.")),
    h("div", { class: "gates" }, gates),
    h("section", { id: "decisions" }, h("h2", {}, "Decisions"),
      h("ol", { class: "timeline" }, tl.events.map((e) => h("li", { "data-kind": e.kind }, h("span", { class: "muted" }, time(e.at)), " ", e.summary)))),
  ];
}

// --- routing, sign-in and refresh ------------------------------------------

function showError(e) {
  const box = document.getElementById("updated");
  box.textContent = `Error: ${e.message}`;
  box.className = "error";
}

async function whoami() {
  try {
    me = await api("/api/v1/whoami");
    document.getElementById("login").hidden = true;
    document.getElementById("who").textContent = `${me.name} (${me.role})`;
    return true;
  } catch (e) {
    if (e.status === 401) {
      document.getElementById("login").hidden = false;
      document.getElementById("view").replaceChildren();
      if (sessionStorage.getItem(TOKEN_KEY)) document.getElementById("login-error").textContent = e.message;
      return false;
    }
    throw e;
  }
}

function route() {
  const parts = location.hash.replace(/^#\/?/, "").split("/").filter(Boolean).map(decodeURIComponent);
  if (parts[0] === "models" && parts[1]) return { view: () => modelView(parts[1]), crumbs: [["Models", "#/"], [parts[1]]] };
  if (parts[0] === "rollouts" && /^\d+$/.test(parts[1] || "")) return { view: () => rolloutView(parts[1]), crumbs: [["Overview", "#/"], [`Rollout #${parts[1]}`]] };
  return { view: overview, crumbs: [] };
}

let busy = false;
const typing = () => document.activeElement && document.activeElement.tagName === "INPUT";
async function refresh(force = false) {
  // Do not redraw under a person typing a reason.
  if (busy || (!force && typing())) return;
  busy = true;
  try {
    if (!me && !(await whoami())) return;
    const { view, crumbs } = route();
    const nodes = await view();
    // Nor under one who opened a reason box while this redraw was fetching.
    if (!force && typing()) return;
    document.getElementById("crumbs").replaceChildren(...crumbs.map(([t, href]) => (href ? h("a", { href }, t) : h("span", {}, ` / ${t}`))));
    document.getElementById("view").replaceChildren(...nodes.flat().filter(Boolean));
    const box = document.getElementById("updated");
    box.className = "";
    box.textContent = `Updated ${new Date().toLocaleTimeString()}; refreshes every ${REFRESH_MS / 1000} s.`;
    document.body.dataset.ready = "true";
  } catch (e) {
    if (e.status === 401) { me = null; await whoami(); } else showError(e);
  } finally {
    busy = false;
  }
}

document.getElementById("login").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  sessionStorage.setItem(TOKEN_KEY, document.getElementById("token").value.trim());
  me = null;
  await refresh(true);
});
window.addEventListener("hashchange", () => refresh(true));
refresh(true);
setInterval(refresh, REFRESH_MS);
