// The console page: reads /api/queue and /api/board every POLL_MS and draws them; acts through
// POST /api/jobs/<id>/<act> with the session's CSRF token. Text goes in through textContent only,
// so a job id or a reason can never become markup.
"use strict";

const POLL_MS = 1500; // the issue asks for changes on the page within 2 s
// A read unanswered by then is given up: polling waits for each read, and one that never ends
// would freeze the page without a word.
const READ_MS = 15000;
const root = document.getElementById("console");
const csrf = root.dataset.csrf;
const signedIn = root.dataset.signedIn === "yes";
const drawn = {}; // each section's last data, so a section is redrawn only when it changed
const sending = new Set(); // acts not answered yet: a second click does not send one again
let busy = false;

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "text") node.textContent = value;
    else node.setAttribute(key, value);
  }
  for (const child of children) {
    if (child !== null && child !== undefined) node.append(child);
  }
  return node;
}

function ago(iso) {
  if (!iso) return "";
  const s = Math.max(0, Math.round((Date.now() - Date.parse(iso)) / 1000));
  if (s < 90) return `${s} s ago`;
  if (s < 5400) return `${Math.round(s / 60)} min ago`;
  return `${Math.round(s / 3600)} h ago`;
}

function duration(s) {
  if (s === null || s === undefined) return "—";
  if (s < 90) return `${Math.round(s)} s`;
  if (s < 5400) return `${Math.round(s / 60)} min`;
  return `${(s / 3600).toFixed(1)} h`;
}

function usd(v) {
  return v === null || v === undefined ? "—" : `$${Number(v).toFixed(2)}`;
}

function table(headers, rows, empty) {
  if (!rows.length) return el("p", { class: "empty", text: empty });
  const head = el("tr", {}, ...headers.map((h) => el("th", { text: h })));
  return el("table", {}, el("thead", {}, head), el("tbody", {}, ...rows));
}

// Only a web address becomes a link: a javascript: one would run on a click.
const WEB = /^https?:\/\//i;

function jobLink(id, link) {
  return link && WEB.test(link) ? el("a", { href: link, target: "_blank", rel: "noopener", text: id }) : id;
}

// A form per thing acted on: it carries the session's CSRF token, a reason field where one is
// asked, and a priority choice for `priority`. `base` is the API path acts are appended to.
function actForm(base, name, acts, withReason, priority) {
  if (!signedIn) return el("span", { class: "muted", text: "sign in to act" });
  const form = el("form", { class: "act", "data-for": name });
  form.append(el("input", { type: "hidden", name: "csrf", value: csrf }));
  if (withReason) {
    const reason = el("input", { type: "text", name: "reason", placeholder: "reason", maxlength: "1000" });
    // Enter would submit with the form's first button, Approve or Drain: an act is a click.
    reason.addEventListener("keydown", (event) => {
      if (event.key === "Enter") event.preventDefault();
    });
    form.append(reason);
  }
  if (priority !== undefined) {
    const choice = el("select", { name: "priority", title: "priority: 1 first" });
    for (let n = 1; n <= 5; n++) choice.append(el("option", { value: String(n), selected: n === priority ? "selected" : null, text: String(n) }));
    form.append(choice);
  }
  for (const act of acts) {
    const label = act[0].toUpperCase() + act.slice(1);
    form.append(el("button", { type: "submit", value: act, class: act, "data-act": act, text: label }));
  }
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const act = event.submitter ? event.submitter.dataset.act : acts[0];
    const body = { reason: form.elements.reason ? form.elements.reason.value : "" };
    if (act === "priority") body.priority = Number(form.elements.priority.value);
    send(`${base}/${act}`, `${act} ${name}`, body, form.elements.csrf.value);
  });
  return form;
}

function jobForm(jobId, acts, withReason, priority) {
  return actForm(`/api/jobs/${encodeURIComponent(jobId)}`, jobId, acts, withReason, priority);
}

// An answer's JSON; null when it is none (a proxy's error page, a body cut short).
async function answerOf(response) {
  const text = await response.text();
  try {
    return JSON.parse(text);
  } catch {
    return null;
  }
}

// What went wrong, in a line: the API's one-line error, else the status alone.
function refusal(response, answer) {
  const said = answer && typeof answer.error === "string" ? answer.error : "the answer is not the console's JSON";
  return `(${response.status}): ${said}`;
}

function tell(className, text) {
  const note = document.getElementById("acted");
  note.hidden = false;
  note.className = className;
  note.textContent = text;
}

async function send(path, what, body, token) {
  if (sending.has(path)) return;
  sending.add(path);
  tell("note", `${what}…`);
  try {
    const response = await fetch(path, {
      method: "POST",
      headers: { "Content-Type": "application/json", "X-CSRF-Token": token },
      body: JSON.stringify(body),
      credentials: "same-origin",
    });
    const answer = await answerOf(response);
    if (response.ok && answer) {
      tell("note", answer.state ? `${what}: now ${answer.state}` : `${what}: done`);
    } else {
      tell("problem", `${what} refused ${refusal(response, answer)}`);
    }
  } catch (err) {
    tell("problem", `${what}: ${err.message || err}`);
  } finally {
    sending.delete(path);
  }
  refresh();
}

function drawHosts(queue) {
  if (queue.pool !== "running") {
    const why = queue.pool === "closed" ? `the GPU pool is closed (${queue.closed})` : "no job has asked for a GPU place yet";
    return el("p", { class: "empty", text: why });
  }
  const rows = queue.hosts.map((h) => {
    const used = h.places.length;
    const load = el("div", { class: "meter" }, el("div", { class: "fill" }));
    load.firstChild.style.width = `${h.max_jobs ? Math.min(100, (100 * used) / h.max_jobs) : 0}%`;
    const drained = h.drained ? `drained by ${h.drained.by}${h.drained.reason ? ": " + h.drained.reason : ""}` : "";
    const reach = h.reachable === false ? "unreachable" : h.reachable ? "reachable" : "not seen yet";
    const caps = h.capabilities;
    const files = caps ? Object.values(caps.models || {}).reduce((a, b) => a + b, 0) : null;
    const warm = (h.warm || []).map((m) => m.split("/").pop()).join(", ");
    return el(
      "tr",
      { "data-host": h.name },
      el("td", { text: h.name }),
      el("td", {}, el("span", { text: `${used} of ${h.max_jobs}` }), load),
      el("td", { text: reach }),
      el("td", { text: drained || "—" }),
      el("td", { text: h.places.map((p) => `${p.job_id} (${p.state || "?"})`).join(", ") || "—" }),
      el("td", { text: caps ? `${caps.nodes} node classes, ${files} model files` : "not read yet" }),
      el("td", { class: "warm", text: warm || "—" }),
      el("td", {}, actForm(`/api/hosts/${encodeURIComponent(h.name)}`, h.name, [h.drained ? "resume" : "drain"], !h.drained))
    );
  });
  return table(["host", "places", "reachable", "drained", "held by", "can run", "warm models", ""], rows, "no GPU hosts");
}

function drawRenders(renders) {
  const rows = renders.map((r) => {
    const pct = r.progress && r.progress.percent !== null ? r.progress.percent : null;
    const bar = el("div", { class: "meter" }, el("div", { class: "fill" }));
    bar.firstChild.style.width = `${pct === null ? 0 : pct}%`;
    return el(
      "tr",
      { "data-job": r.job_id },
      el("td", {}, jobLink(r.job_id, r.link)),
      el("td", { text: r.host }),
      el("td", { text: r.team || "—" }),
      el("td", { class: "progress" }, bar, el("span", { class: "brief", text: r.brief || r.state })),
      el("td", {}, jobForm(r.job_id, ["cancel"], false))
    );
  });
  return table(["job", "host", "team", "progress", ""], rows, "nothing renders now");
}

const LINE_SHOWN = 200; // a page of 2,000 rows, each with its forms, redrawn every change is slow

function drawLine(queue) {
  const rows = queue.line.slice(0, LINE_SHOWN).map((i) =>
    el(
      "tr",
      { "data-job": i.job_id },
      el("td", { text: String(i.position) }),
      el("td", { text: i.job_id }),
      el("td", { text: i.team || "—" }),
      el("td", { text: String(i.priority) }),
      el("td", { text: i.state }),
      el("td", { text: i.why || "—" }),
      el("td", { text: duration(i.eta_s) }),
      el("td", { text: ago(i.since) }),
      el("td", {}, jobForm(i.job_id, ["priority", "cancel"], false, i.priority))
    )
  );
  if (queue.line.length > LINE_SHOWN) {
    const more = queue.line.length - LINE_SHOWN;
    rows.push(el("tr", { class: "more" }, el("td", { colspan: "9", text: `… and ${more} more in line (GET /api/queue has them all)` })));
  }
  return table(["#", "job", "team", "priority", "state", "why", "ETA", "since", ""], rows, "nobody waits");
}

function drawAwaiting(awaiting) {
  const rows = awaiting.map((a) =>
    el(
      "tr",
      { "data-job": a.job_id },
      el("td", {}, jobLink(a.job_id, a.link)),
      el("td", { text: a.team || "—" }),
      el("td", { text: (a.reasons || []).join(", ") || a.trigger || "—" }),
      el("td", { class: "quote", text: `${usd(a.estimate_usd)}${a.provider ? " on " + a.provider : ""}` }),
      el("td", { text: usd(a.day_remaining_usd) }),
      el("td", {}, jobForm(a.job_id, ["approve", "reject", "cancel"], true))
    )
  );
  return table(["job", "team", "why", "quote", "left today", ""], rows, "nobody waits for a person");
}

const SVG = "http://www.w3.org/2000/svg";
function svg(tag, attrs, text) {
  const node = document.createElementNS(SVG, tag);
  for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, value);
  if (text !== undefined) node.textContent = text;
  return node;
}

function drawSpend(spend) {
  if (!spend.days.length) return el("p", { class: "empty", text: "no cloud spend this month" });
  const most = Math.max(...spend.days.map((d) => Object.values(d.by_team).reduce((a, b) => a + b, 0)));
  const rowH = 22;
  const width = 640;
  const left = 90;
  const chart = svg("svg", { width: String(width + left + 80), height: String(rowH * spend.days.length + 30), role: "img", "aria-label": "cloud spend per day and team" });
  spend.days.forEach((d, i) => {
    const y = i * rowH;
    chart.append(svg("text", { x: "0", y: String(y + 15), class: "label" }, d.day));
    let x = left;
    let total = 0;
    for (const team of spend.teams) {
      const v = d.by_team[team] || 0;
      if (!v) continue;
      const w = Math.max(1, (width * v) / most);
      const rect = svg("rect", { x: String(x), y: String(y + 3), width: String(w), height: String(rowH - 6), class: `team${spend.teams.indexOf(team) % 6}` });
      rect.append(svg("title", {}, `${team}: ${usd(v)}`));
      chart.append(rect);
      x += w;
      total += v;
    }
    chart.append(svg("text", { x: String(x + 6), y: String(y + 15), class: "label" }, usd(total)));
  });
  const legend = el(
    "p",
    { class: "legend" },
    ...spend.teams.map((t, i) => el("span", { class: `key team${i % 6}`, text: t }))
  );
  return el("div", {}, chart, legend, el("p", { text: `today: ${usd(spend.today_spent_usd)} of ${spend.day_budget_usd === null ? "no cap" : usd(spend.day_budget_usd)}` }));
}

function drawRecent(recent) {
  const rows = recent.map((j) =>
    el(
      "tr",
      { "data-job": j.job_id },
      el("td", {}, jobLink(j.job_id, j.link)),
      el("td", { class: "state", text: j.state }),
      el("td", { text: j.route || "—" }),
      el("td", { text: j.host || "—" }),
      el("td", { text: ago(j.started) })
    )
  );
  return table(["job (Temporal UI)", "state", "route", "host", "started"], rows, "no jobs yet");
}

function put(id, data, draw) {
  const key = JSON.stringify(data);
  if (drawn[id] === key) return;
  // A form someone is typing a reason into is left alone until they send it.
  const target = document.getElementById(id);
  const active = document.activeElement;
  if (active && ["INPUT", "SELECT"].includes(active.tagName) && target.contains(active)) return;
  drawn[id] = key;
  target.replaceChildren(data === null ? el("p", { class: "empty", text: "not readable now" }) : draw(data));
}

async function getJson(path) {
  let response, body;
  try {
    response = await fetch(path, { credentials: "same-origin", signal: AbortSignal.timeout(READ_MS) });
    body = await answerOf(response);
  } catch (err) {
    throw err.name === "TimeoutError" ? new Error(`${path} did not answer within ${READ_MS / 1000} s`) : err;
  }
  if (!response.ok || body === null) throw new Error(`${path} ${refusal(response, body)}`);
  return body;
}

async function refresh() {
  if (busy) return;
  busy = true;
  const problems = [];
  try {
    const [queue, board] = await Promise.allSettled([getJson("/api/queue"), getJson("/api/board")]);
    if (queue.status === "fulfilled") {
      put("hosts", queue.value, drawHosts);
      put("line", queue.value, drawLine);
    } else problems.push(String(queue.reason.message || queue.reason));
    if (board.status === "fulfilled") {
      const b = board.value;
      put("renders", b.renders, drawRenders);
      put("awaiting", b.awaiting, drawAwaiting);
      put("spend", b.spend, drawSpend);
      put("recent", b.recent, drawRecent);
      problems.push(...b.problems);
    } else problems.push(String(board.reason.message || board.reason));
    document.getElementById("updated").textContent = `updated ${new Date().toLocaleTimeString()}`;
  } catch (err) {
    problems.push(`the page could not draw an answer: ${err.message || err}`);
  } finally {
    busy = false;
  }
  // The reads' problems as they are now: one that has cleared leaves the page.
  const note = document.getElementById("problems");
  note.hidden = !problems.length;
  note.textContent = problems.join("; ");
}

refresh();
setInterval(refresh, POLL_MS);
