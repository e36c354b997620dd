// agentrl view: plain JavaScript over the JSON API (/api/...). No framework, nothing from the network.
// The state lives in the address's hash (#run=...&tab=...), so a view can be bookmarked and shared.
"use strict";

const $ = (sel, el = document) => el.querySelector(sel);
const FILTERS = ["kind", "step", "task", "index", "group", "status", "min_reward", "max_reward"];
const PAGE = 100;
let runs = [];
let curvesCache = null;

function state() { return new URLSearchParams(location.hash.slice(1)); }
function go(changes, replace = false) {
  const s = state();
  for (const [k, v] of Object.entries(changes)) {
    if (v === null || v === undefined || v === "") s.delete(k); else s.set(k, v);
  }
  const hash = "#" + s.toString();
  if (replace) history.replaceState(null, "", hash); else location.hash = hash;
  if (replace) render();
}

function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "onclick" || k === "onchange" || k === "oninput") el[k] = v;
    else if (k === "class") el.className = v;
    else if (v !== null && v !== undefined && v !== false) el.setAttribute(k, v);
  }
  for (const c of children.flat()) if (c !== null && c !== undefined) el.append(c instanceof Node ? c : String(c));
  return el;
}

async function api(path, params = {}) {
  const q = new URLSearchParams(Object.entries(params).filter(([, v]) => v !== null && v !== undefined && v !== ""));
  const r = await fetch(`/api/${path}?${q}`, { credentials: "same-origin" });
  const body = await r.json().catch(() => ({ detail: r.statusText }));
  if (!r.ok) throw new Error(body.detail || r.statusText);
  return body;
}

function showError(e) {
  const box = $("#error");
  box.textContent = String(e.message || e);
  box.hidden = false;
  setTimeout(() => { box.hidden = true; }, 8000);
}

const fmt = (v, d = 3) => (v === null || v === undefined) ? "–" : (typeof v === "number" ? (Number.isInteger(v) ? String(v) : v.toFixed(d)) : String(v));
const statusBadge = (s) => h("span", { class: "badge " + (s === "completed" ? "completed" : "bad") }, s);

// ---------------------------------------------------------------- runs and steps (sidebar)

async function loadRuns() {
  const data = await api("runs");
  runs = data.runs;
  $("#root").textContent = data.root;
  const s = state();
  if (!s.get("run") && runs.length) { go({ run: runs[0].name }, true); return false; }
  const list = $("#runs");
  list.replaceChildren(...runs.map((r) => h("li", {
    class: r.name === s.get("run") ? "active" : "", "data-run": r.name,
    onclick: () => go({ run: r.name, id: null, step: null, group: null, task: null, index: null, offset: null }),
  }, h("div", { class: "name" }, r.name),
     h("div", { class: "muted" },
       r.running ? h("span", { class: "badge running" }, "running") : r.finished ? h("span", { class: "badge finished" }, "finished") : null,
       " ", r.last_step !== null ? `step ${r.last_step}` : "", " ",
       Object.entries(r.kinds).map(([k, n]) => `${k} ${n}`).join(", ")))));
  if (!runs.length) list.replaceChildren(h("li", { class: "muted" }, "no runs here yet (a run folder holds trajectories.sqlite or metrics.jsonl)"));
  return true;
}

function currentRun() { return runs.find((r) => r.name === state().get("run")); }

async function loadSteps() {
  const run = currentRun();
  const table = $("#steps");
  if (!run || !run.store) { table.replaceChildren(); $("#tasks").replaceChildren(); return; }
  const [steps, tasks] = await Promise.all([api("steps", { run: run.name }), api("tasks", { run: run.name })]);
  const s = state();
  $("#tasks").replaceChildren(
    h("tr", {}, h("th", {}, "task"), h("th", { class: "num" }, "n"), h("th", { class: "num" }, "reward"), h("th", { class: "num" }, "success")),
    ...tasks.map((t) => h("tr", {
      class: "clickable" + (t.task === s.get("task") ? " selected" : ""),
      onclick: () => go({ tab: "trajectories", task: t.task, id: null, offset: null }),
    }, h("td", {}, t.task), h("td", { class: "num" }, t.trajectories), h("td", { class: "num" }, fmt(t.reward, 2)),
       h("td", { class: "num" }, fmt(t.success, 2)))));
  table.replaceChildren(
    h("tr", {}, h("th", {}, "kind"), h("th", { class: "num" }, "step"), h("th", { class: "num" }, "n"), h("th", { class: "num" }, "reward")),
    ...steps.map((st) => h("tr", {
      class: "clickable" + (String(st.step) === s.get("step") && st.kind === s.get("kind") ? " selected" : ""),
      onclick: () => go({ tab: "trajectories", kind: st.kind, step: st.step ?? "", id: null, offset: null }),
    }, h("td", {}, st.kind), h("td", { class: "num" }, fmt(st.step)), h("td", { class: "num" }, st.trajectories),
       h("td", { class: "num" }, fmt(st.reward, 2)))));
}

// ---------------------------------------------------------------- trajectories tab

async function renderTrajectories(main) {
  const s = state();
  const run = currentRun();
  if (!run.store) { main.replaceChildren(h("p", { class: "muted" }, "This run has no trajectory store (trajectories.sqlite): see its curves.")); return; }
  const params = { run: run.name, limit: PAGE, offset: s.get("offset") || 0 };
  for (const f of FILTERS) params[f] = s.get(f);
  const [list, tasks] = await Promise.all([api("trajectories", params), api("tasks", { run: run.name })]);
  const select = (name, options) => h("select", { name, onchange: (e) => go({ [name]: e.target.value, offset: null }) },
    h("option", { value: "" }, "all"), ...options.map((o) => h("option", { value: o, selected: s.get(name) === String(o) ? "" : null }, o)));
  const number = (name, placeholder) => h("input", { type: "number", step: "any", name, placeholder, value: s.get(name) || "",
    onchange: (e) => go({ [name]: e.target.value, offset: null }) });
  const statuses = Object.keys(list.statuses);
  if (s.get("status") && !statuses.includes(s.get("status"))) statuses.push(s.get("status"));
  const filters = h("div", { class: "filters" },
    h("label", {}, "kind", select("kind", Object.keys(run.kinds))),
    h("label", {}, "step", h("input", { name: "step", type: "number", value: s.get("step") || "", onchange: (e) => go({ step: e.target.value, offset: null }) })),
    h("label", {}, "task", select("task", tasks.map((t) => t.task))),
    h("label", {}, "status", select("status", statuses)),
    h("label", {}, "reward ≥", number("min_reward", "min")),
    h("label", {}, "reward ≤", number("max_reward", "max")),
    h("label", {}, "group", h("input", { name: "group", value: s.get("group") || "", onchange: (e) => go({ group: e.target.value, offset: null }) })),
    h("button", { onclick: () => go(Object.fromEntries([...FILTERS, "offset"].map((f) => [f, null]))) }, "clear filters"));
  const cols = ["id", "kind", "step", "task", "task_index", "sample", "status", "reward", "advantage", "num_turns", "num_tool_calls", "num_tokens", "max_version"];
  const heads = { task_index: "index", num_turns: "turns", num_tool_calls: "tool calls", num_tokens: "tokens", max_version: "version" };
  const numeric = new Set(["id", "step", "sample", "reward", "advantage", "num_turns", "num_tool_calls", "num_tokens", "max_version"]);
  const table = h("table", { id: "trajectory-list" },
    h("tr", {}, cols.map((c) => h("th", { class: numeric.has(c) ? "num" : "" }, heads[c] || c)), h("th", {}, "group")),
    list.trajectories.map((t) => h("tr", { class: "clickable", "data-id": t.id, onclick: () => go({ tab: "trajectory", id: t.id }) },
      cols.map((c) => h("td", { class: numeric.has(c) ? "num" : "" }, c === "status" ? statusBadge(t.status) : fmt(t[c]))),
      h("td", { class: "muted" }, t.group_id))));
  const offset = Number(s.get("offset") || 0);
  const pager = h("div", { class: "pager" },
    h("span", { class: "muted", id: "count" }, `${list.total} trajectories` + (list.total > PAGE ? `, ${offset + 1}–${Math.min(offset + PAGE, list.total)}` : "")),
    offset > 0 ? h("button", { onclick: () => go({ offset: Math.max(0, offset - PAGE) }) }, "previous") : null,
    offset + PAGE < list.total ? h("button", { onclick: () => go({ offset: offset + PAGE }) }, "next") : null,
    h("span", { class: "muted" }, Object.entries(list.statuses).map(([k, n]) => `${k}: ${n}`).join(" · ")));
  main.replaceChildren(filters, pager, table);
}

// ---------------------------------------------------------------- groups tab

async function renderGroups(main) {
  const s = state();
  const run = currentRun();
  const params = { run: run.name };
  for (const f of FILTERS) params[f] = s.get(f);
  const groups = await api("groups", params);
  main.replaceChildren(
    h("p", { class: "muted" }, `${groups.length} groups` + (s.get("step") ? ` at step ${s.get("step")}` : "") +
      ". A group whose samples all got the same reward has zero advantage: it teaches nothing."),
    h("table", { id: "group-list" },
      h("tr", {}, ["kind", "step", "task", "index", "samples", "min reward", "mean", "max reward", "statuses", "group"].map((c) => h("th", {}, c))),
      groups.map((g) => h("tr", { class: "clickable", onclick: () => go({ tab: "trajectories", group: g.group_id, step: g.step ?? "", kind: g.kind, offset: null }) },
        h("td", {}, g.kind), h("td", { class: "num" }, fmt(g.step)), h("td", {}, g.task), h("td", {}, fmt(g.task_index)),
        h("td", { class: "num" }, g.samples), h("td", { class: "num" }, fmt(g.min_reward, 2)), h("td", { class: "num" }, fmt(g.reward, 2)),
        h("td", { class: "num" }, fmt(g.max_reward, 2)),
        h("td", {}, g.min_reward === g.max_reward ? h("span", { class: "badge" }, "no signal") : "", " ", g.statuses),
        h("td", { class: "muted" }, g.group_id)))));
}

// ---------------------------------------------------------------- one trajectory

function renderMessages(messages) {
  if (!messages) return h("p", { class: "muted" }, "no messages stored");
  let turn = -1;
  return messages.map((m) => {
    if (m.role === "assistant") turn += 1;
    const content = typeof m.content === "string" ? m.content : JSON.stringify(m.content, null, 2);
    const calls = (m.tool_calls || []).map((c) => {
      const fn = c.function || {};
      let args = fn.arguments;
      try { args = JSON.stringify(JSON.parse(args), null, 2); } catch (e) { /* shown as the model wrote it */ }
      return h("div", { class: "tool-call" }, h("span", { class: "fn" }, "⚙ " + (fn.name || "?")), h("span", { class: "muted" }, " " + (c.id || "")), h("pre", {}, args));
    });
    return h("div", { class: "msg " + m.role },
      h("div", { class: "role" }, m.role + (m.role === "assistant" ? ` · turn ${turn}` : ""), m.tool_call_id ? h("span", { class: "call-id" }, ` · ${m.tool_call_id}`) : null),
      content ? h("pre", {}, content) : null, calls,
      m.reasoning_content ? h("details", {}, h("summary", { class: "muted" }, "reasoning"), h("pre", {}, m.reasoning_content)) : null);
  });
}

const COLORINGS = {
  mask: { label: "loss mask", legend: "trained (sampled) tokens vs prompt, template and environment tokens" },
  logprobs: { label: "sampling log-prob", legend: "log-prob the engine sampled with: 0 (white) to -5 and below (red)" },
  ratios: { label: "importance ratio", legend: "learner / sampling probability: below 1 blue, above 1 red; outlined outside (0.8, 1.2)" },
  learner_logprobs: { label: "learner log-prob", legend: "log-prob under the weights the step started from: 0 (white) to -5 (red)" },
  advantages: { label: "advantage", legend: "per-token advantage: negative blue, positive green" },
  versions: { label: "policy version", legend: "the policy version that sampled the token (lighter: older)" },
};

function tokenColor(mode, tok, i) {
  const masked = tok.loss_mask[i];
  if (!masked) return null;
  if (mode === "mask") return "rgba(47,111,222,0.22)";
  const v = tok[mode] ? tok[mode][i] : null;
  if (v === null || v === undefined) return "rgba(0,0,0,0.06)";
  if (mode === "logprobs" || mode === "learner_logprobs") { const a = Math.min(1, -v / 5); return `rgba(214,48,39,${(0.05 + 0.75 * a).toFixed(3)})`; }
  if (mode === "ratios") {
    const l = Math.log(v); const a = Math.min(1, Math.abs(l) / Math.log(1.5));
    return l >= 0 ? `rgba(214,48,39,${(0.08 + 0.7 * a).toFixed(3)})` : `rgba(47,111,222,${(0.08 + 0.7 * a).toFixed(3)})`;
  }
  if (mode === "advantages") { const a = Math.min(1, Math.abs(v)); return v >= 0 ? `rgba(28,138,74,${(0.1 + 0.6 * a).toFixed(3)})` : `rgba(47,111,222,${(0.1 + 0.6 * a).toFixed(3)})`; }
  if (mode === "versions") { const max = Math.max(...tok.versions); const a = max > 0 ? 0.15 + 0.6 * (v / max) : 0.5; return `rgba(156,111,216,${a.toFixed(3)})`; }
  return null;
}

function renderTokens(tok, mode) {
  if (!tok) return h("p", { class: "muted" }, "no tokens stored for this trajectory (an OpenAI endpoint's episode)");
  const box = h("div", { class: "tokens", id: "tokens" });
  const spans = [];
  for (let i = 0; i < tok.input_ids.length; i++) {
    const text = tok.text ? tok.text[i] : `[${tok.input_ids[i]}]`;
    const masked = tok.loss_mask[i];
    const parts = [`#${i} id ${tok.input_ids[i]}`, masked ? "trained" : "not trained"];
    for (const k of ["logprobs", "learner_logprobs", "ratios", "advantages", "versions"]) {
      if (masked && tok[k] && tok[k][i] !== null && tok[k][i] !== undefined) parts.push(`${k.replace("_", " ")} ${fmt(tok[k][i], 4)}`);
    }
    const span = h("span", { class: "t" + (masked ? "" : " off"), title: parts.join("\n"), "data-i": i }, text.replace(/\n/g, "↵\n"));
    const bg = tokenColor(mode, tok, i);
    if (bg) span.style.background = bg;
    if (mode === "ratios" && masked && tok.ratios && tok.ratios[i] !== null && (tok.ratios[i] < 0.8 || tok.ratios[i] > 1.2)) span.classList.add("clipped");
    spans.push(span);
  }
  box.append(...spans);
  return box;
}

async function renderTrajectory(main) {
  const s = state();
  const t = await api("trajectory", { run: s.get("run"), id: s.get("id") });
  const mode = s.get("color") || "mask";
  const meta = [["task", t.task], ["index", t.task_index], ["kind", t.kind], ["step", t.step], ["group", t.group_id], ["sample", t.sample],
    ["status", t.status], ["failure", t.failure], ["reward", fmt(t.reward)], ["training reward", fmt(t.training_reward)], ["advantage", fmt(t.advantage)],
    ["turns", t.num_turns], ["tokens", t.num_tokens], ["trained tokens", t.num_action_tokens], ["versions", `${fmt(t.min_version)}–${fmt(t.max_version)}`],
    ["tool calls", (t.tool_calls || []).length], ["model", t.model]];
  const tok = t.tokens;
  const available = Object.keys(COLORINGS).filter((k) => k === "mask" || (tok && tok[k] && tok[k].some((v) => v !== null)));
  const picker = h("select", { id: "coloring", onchange: (e) => go({ color: e.target.value }) },
    available.map((k) => h("option", { value: k, selected: k === mode ? "" : null }, COLORINGS[k].label)));
  const others = t.same_task.filter((o) => o.step !== t.step && o.step !== null);
  const compare = others.length ? h("button", { id: "compare-button", onclick: () => go({ tab: "compare", cmp_task: t.task, cmp_index: t.task_index, cmp_a: t.step, cmp_b: others[others.length - 1].step, a_id: t.id, b_id: null }) }, "compare with another step") : null;
  main.replaceChildren(
    h("div", { class: "card" },
      h("div", {}, h("button", { onclick: () => history.back() }, "← back"), " ", compare, " ", h("strong", {}, `trajectory ${t.id}`), " ", h("span", { class: "muted" }, t.uid)),
      h("div", { class: "meta", id: "meta" }, meta.map(([k, v]) => h("div", {}, h("span", {}, k), v === null || v === undefined ? "–" : String(v))))),
    h("div", { class: "cols" },
      h("div", { class: "card", id: "conversation" }, h("h3", {}, "Conversation, turn by turn"), renderMessages(t.messages)),
      h("div", { class: "card" }, h("h3", {}, "Tokens ", picker),
        h("div", { class: "legend" }, COLORINGS[mode] ? COLORINGS[mode].legend : "", tok && !tok.text ? " · no tokenizer found: ids shown (--tokenizer DIR)" : ""),
        renderTokens(tok, available.includes(mode) ? mode : "mask"))));
}

// ---------------------------------------------------------------- compare two steps of a task

async function renderCompare(main) {
  const s = state();
  const run = currentRun();
  const tasks = await api("tasks", { run: run.name });
  const task = s.get("cmp_task") || (tasks[0] && tasks[0].task);
  if (!task) { main.replaceChildren(h("p", { class: "muted" }, "no trajectories yet")); return; }
  const index = s.get("cmp_index") || "";
  const all = await api("trajectories", { run: run.name, task, index, limit: 2000 });
  const indices = [...new Set(all.trajectories.map((t) => String(t.task_index)))];
  const steps = [...new Set(all.trajectories.map((t) => t.step).filter((x) => x !== null))].sort((a, b) => a - b);
  const a = s.get("cmp_a") || (steps.length ? steps[0] : "");
  const b = s.get("cmp_b") || (steps.length ? steps[steps.length - 1] : "");
  const choose = (name, values, current, label) => h("label", {}, label, h("select", { name, onchange: (e) => go({ [name]: e.target.value, a_id: null, b_id: null }, true) },
    name === "cmp_index" ? h("option", { value: "" }, "any") : null,
    values.map((v) => h("option", { value: v, selected: String(v) === String(current) ? "" : null }, v))));
  const controls = h("div", { class: "filters" },
    choose("cmp_task", tasks.map((t) => t.task), task, "task"),
    choose("cmp_index", index ? [...new Set([index, ...indices])] : indices, index, "index"),
    choose("cmp_a", steps, a, "step A"), choose("cmp_b", steps, b, "step B"));
  const side = async (step, key) => {
    const rows = all.trajectories.filter((t) => String(t.step) === String(step)).sort((x, y) => (y.reward ?? -1e9) - (x.reward ?? -1e9));
    const chosen = s.get(key) || (rows[0] && rows[0].id);
    const col = h("div", { class: "card compare-side", "data-step": step });
    const mean = rows.length ? rows.reduce((acc, r) => acc + (r.reward ?? 0), 0) / rows.length : null;
    col.append(h("h3", {}, `step ${step}`, h("span", { class: "muted" }, ` · ${rows.length} trajectories · mean reward ${fmt(mean, 2)}`)));
    col.append(h("table", { class: "compact" }, rows.map((r) => h("tr", { class: "clickable" + (String(r.id) === String(chosen) ? " selected" : ""), onclick: () => go({ [key]: r.id }, true) },
      h("td", {}, `#${r.id}`), h("td", {}, r.kind), h("td", {}, `index ${r.task_index}`), h("td", {}, `sample ${fmt(r.sample)}`), h("td", {}, statusBadge(r.status)), h("td", { class: "num" }, `reward ${fmt(r.reward, 2)}`)))));
    if (chosen) {
      const t = await api("trajectory", { run: run.name, id: chosen });
      col.append(h("p", { class: "muted" }, `trajectory ${t.id}: ${t.num_turns} turns, ${(t.tool_calls || []).length} tool calls, advantage ${fmt(t.advantage)}`),
        ...renderMessages(t.messages));
    }
    return col;
  };
  const [left, right] = await Promise.all([side(a, "a_id"), side(b, "b_id")]);
  main.replaceChildren(controls, h("div", { class: "cols", id: "compare" }, left, right));
}

// ---------------------------------------------------------------- training curves

function defaultKeys(keys) {
  const wanted = ["reward", "success", "learner/loss", "learner/ratio", "learner/entropy", "learner/grad_norm", "version_lag/mean", "time/step_s"];
  const found = wanted.filter((k) => keys.includes(k));
  return found.length ? found : keys.slice(0, 6);
}

function lineChart(rows, key) {
  const pts = rows.filter((r) => typeof r[key] === "number" && typeof r.step === "number").map((r) => [r.step, r[key]]);
  const W = 360, H = 170, L = 56, R = 8, T = 8, B = 22;
  const svg = (tag, attrs) => { const el = document.createElementNS("http://www.w3.org/2000/svg", tag); for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, v); return el; };
  const root = svg("svg", { width: "100%", viewBox: `0 0 ${W} ${H}`, "data-key": key });
  if (!pts.length) { const t = svg("text", { x: L, y: H / 2 }); t.textContent = "no values"; root.append(t); return root; }
  let [x0, x1] = [Math.min(...pts.map((p) => p[0])), Math.max(...pts.map((p) => p[0]))];
  let [y0, y1] = [Math.min(...pts.map((p) => p[1])), Math.max(...pts.map((p) => p[1]))];
  if (x0 === x1) { x0 -= 1; x1 += 1; }
  if (y0 === y1) { y0 -= Math.abs(y0) * 0.1 || 1; y1 += Math.abs(y1) * 0.1 || 1; }
  const digits = Math.min(6, Math.max(0, Math.ceil(-Math.log10((y1 - y0) / 4)) + 1));  // ticks that differ
  const X = (x) => L + (x - x0) / (x1 - x0) * (W - L - R);
  const Y = (y) => T + (1 - (y - y0) / (y1 - y0)) * (H - T - B);
  for (let i = 0; i <= 4; i++) {
    const yv = y0 + (y1 - y0) * i / 4;
    root.append(svg("line", { x1: L, x2: W - R, y1: Y(yv), y2: Y(yv), stroke: "#eceef2" }));
    const t = svg("text", { x: L - 4, y: Y(yv) + 3, "text-anchor": "end" }); t.textContent = yv.toFixed(digits); root.append(t);
  }
  for (const xv of new Set([x0, Math.round((x0 + x1) / 2), x1])) { const t = svg("text", { x: X(xv), y: H - 6, "text-anchor": "middle" }); t.textContent = String(xv); root.append(t); }
  root.append(svg("polyline", { points: pts.map((p) => `${X(p[0]).toFixed(1)},${Y(p[1]).toFixed(1)}`).join(" "), fill: "none", stroke: "#2f6fde", "stroke-width": 1.6 }));
  for (const p of pts) {
    const c = svg("circle", { cx: X(p[0]).toFixed(1), cy: Y(p[1]).toFixed(1), r: pts.length > 60 ? 1.2 : 2.4, fill: "#2f6fde" });
    const title = svg("title", {}); title.textContent = `step ${p[0]}: ${p[1]}`; c.append(title); root.append(c);
  }
  return root;
}

async function renderCurves(main) {
  const s = state();
  const run = currentRun();
  const data = await api("metrics", { run: run.name });
  curvesCache = data;
  if (!data.rows.length) { main.replaceChildren(h("p", { class: "muted" }, "no metrics.jsonl lines yet")); return; }
  const chosen = s.get("keys") ? s.get("keys").split(",").filter((k) => data.keys.includes(k)) : defaultKeys(data.keys);
  const filter = s.get("kfilter") || "";
  const toggle = (k, on) => { const set = new Set(chosen); if (on) set.add(k); else set.delete(k); go({ keys: [...set].join(",") || "-" }, true); };
  const keyBox = h("div", { class: "keys" }, data.keys.filter((k) => k.includes(filter)).map((k) =>
    h("label", {}, h("input", { type: "checkbox", value: k, checked: chosen.includes(k) ? "" : null, onchange: (e) => toggle(k, e.target.checked) }), " " + k)));
  main.replaceChildren(
    h("div", { class: "filters" }, h("label", {}, "find a metric", h("input", { id: "kfilter", value: filter, oninput: (e) => go({ kfilter: e.target.value }, true) })),
      h("span", { class: "muted" }, `${data.rows.length} steps in metrics.jsonl · ${data.keys.length} scalars`)),
    keyBox,
    h("div", { class: "charts", id: "charts" }, chosen.map((k) => h("div", { class: "chart" }, h("h3", {}, k), lineChart(data.rows, k)))));
  const input = $("#kfilter"); if (filter && document.activeElement !== input) { input.focus(); input.setSelectionRange(filter.length, filter.length); }
}

// ---------------------------------------------------------------- routing and refresh

const TABS = { trajectories: renderTrajectories, groups: renderGroups, trajectory: renderTrajectory, compare: renderCompare, curves: renderCurves };
let rendering = null;
let pending = null;  // a render asked for while one runs: done after it (a click must not be lost to a refresh)

async function render(refresh = false) {
  if (rendering) { pending = pending === false ? false : refresh; return rendering; }
  rendering = (async () => {
    try {
      if (!(await loadRuns())) return;
      const s = state();
      const tab = s.get("tab") || "trajectories";
      for (const a of document.querySelectorAll("#tabs a")) a.classList.toggle("active", a.dataset.tab === tab || (tab === "trajectory" && a.dataset.tab === "trajectories"));
      await loadSteps();
      const run = currentRun();
      const main = $("#main");
      if (!run) { main.replaceChildren(h("p", { class: "muted" }, runs.length ? "pick a run" : "no runs under this folder yet; this page refreshes")); return; }
      // a refresh redraws lists and curves, not an open trajectory or comparison (it does not change, and you may be reading it)
      if (refresh && (tab === "trajectory" || tab === "compare")) return;
      if (refresh && document.activeElement && document.activeElement.closest && document.activeElement.closest("#main .filters")) return;
      const y = window.scrollY;
      await TABS[tab](main);
      if (refresh) window.scrollTo(0, y);
      $("#updated").textContent = "updated " + new Date().toLocaleTimeString();
      document.body.dataset.ready = "1";
    } catch (e) {
      showError(e);
    } finally {
      rendering = null;
      if (pending !== null) { const again = pending; pending = null; render(again); }
    }
  })();
  return rendering;
}

for (const a of document.querySelectorAll("#tabs a")) {
  a.onclick = (e) => { e.preventDefault(); go({ tab: a.dataset.tab, id: null }); };
}
window.addEventListener("hashchange", () => { document.body.dataset.ready = ""; render(); });
setInterval(() => { if ($("#live").checked) render(true); }, 5000);
render();
