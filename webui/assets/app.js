// walden web view: polls /ui/api/overview and /ui/api/events once a second
// and renders them. No framework, no build step; every value from the API
// is put into the page as text, never as markup (the timelines are SVG
// documents the coordinator drew, parsed as XML).
"use strict";

const POLL_MS = 1000;
const samples = new Map(); // job id -> [{t, bytes}] for the upload rate
const svgVersions = new Map(); // failover id -> version of the drawn timeline
let lastOverview = null;

const $ = (sel) => document.querySelector(sel);
const num = (v) => Number(v || 0);

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null) continue;
    if (k === "class") e.className = v;
    else if (k.startsWith("data-")) e.setAttribute(k, v);
    else e[k] = v;
  }
  for (const c of children) {
    if (c === null || c === undefined) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

function badge(state) {
  return el("span", { class: "badge state-" + state, "data-state": state }, state || "-");
}

function bytes(n) {
  n = num(n);
  if (n >= 1 << 30) return (n / (1 << 30)).toFixed(2) + " GiB";
  if (n >= 1 << 20) return (n / (1 << 20)).toFixed(1) + " MiB";
  if (n >= 1 << 10) return (n / (1 << 10)).toFixed(1) + " KiB";
  return n + " B";
}

function duration(ms) {
  ms = Math.max(0, Math.round(ms));
  if (ms < 1000) return ms + " ms";
  if (ms < 60000) return (ms / 1000).toFixed(2) + " s";
  const m = Math.floor(ms / 60000), s = Math.round((ms % 60000) / 1000);
  return m + "m" + s + "s";
}

function plural(n, one, many) {
  return n === 1 ? "1 " + one : n + " " + many;
}

function clock(ms) {
  if (!num(ms)) return "-";
  return new Date(num(ms)).toISOString().replace("T", " ").replace("Z", "");
}

function ago(ms, now) {
  if (!num(ms)) return "";
  return duration(now - num(ms)) + " ago";
}

async function getJSON(url) {
  const r = await fetch(url, { cache: "no-store" });
  const body = await r.json().catch(() => ({}));
  if (!r.ok) throw new Error(body.error || r.status + " " + r.statusText);
  return body;
}

function replaceRows(tbody, rows) {
  tbody.replaceChildren(...rows);
}

function renderHeader(o) {
  const st = o.status;
  $("#cluster-name").textContent = st.cluster_name;
  $("#answered-by").textContent = st.node_id;
  const members = st.members || [];
  const voters = members.filter((m) => m.role !== "learner").length;
  $("#cluster-summary").replaceChildren(
    "leader ", el("b", { id: "leader", "data-leader": st.leader_id }, st.leader_id || "none"),
    " · term ", el("b", { id: "term" }, st.term),
    " · ", plural(voters, "voter", "voters"),
    " · commit ", el("b", {}, st.commit_index),
    " · answered by ", el("b", {}, st.node_id));
  $("#updated").textContent = "updated " + clock(o.now_unix_ms);
  const known = !!st.progress_by;
  replaceRows($("#members tbody"), members.map((m) => {
    const h = memberHealth(m, st);
    return el("tr", { "data-member": m.id, "data-commits": known ? String(!!m.commits) : "unknown", "data-health": h.kind },
      el("td", {}, m.id),
      el("td", {}, badge(m.id === st.leader_id ? "leader" : m.role)),
      el("td", { class: "health health-" + h.kind, title: h.detail }, h.text),
      el("td", {}, m.version || "-"),
      el("td", { class: "num" }, known ? m.match_index : "-"),
      el("td", {}, m.raft_addr),
      el("td", {}, m.admin_addr));
  }));
}

// memberHealth says whether a coordinator does its part: reachable from
// the answering member, and committing as the leader sees it (it heard
// from the member and the member acknowledged what was committed an
// election timeout ago). A member may apply entries and not commit.
function memberHealth(m, st) {
  const self = m.id === st.node_id;
  if (!self && !m.reachable) {
    return { kind: "down", text: "unreachable", detail: st.node_id + "'s transport does not reach it" };
  }
  if (!st.progress_by) {
    return { kind: "unknown", text: "reachable; commits unknown", detail: "no leader answered: only the leader knows who commits" };
  }
  if (m.role === "learner") {
    return { kind: "learner", text: "learner, catching up", detail: "a learner does not vote; the leader promotes it once it caught up" };
  }
  if (!m.commits) {
    return { kind: "down", text: "reachable, not committing", detail: "the leader (" + st.progress_by + ") has not had its acknowledgement of what was committed an election timeout ago (match index " + m.match_index + ")" };
  }
  return { kind: "ok", text: "commits", detail: "acknowledges the leader's entries" };
}

function lease(ms) {
  ms = num(ms);
  if (ms < 0) return "-";
  if (ms === 0) return "expired";
  return duration(ms);
}

// lastContact is when the coordinators last heard from broker b, from the
// observations that are not alive (each observer's time less the silence
// it measured), or the time it was declared failed.
function lastContact(b) {
  let t = 0;
  for (const x of b.observations || []) {
    if (x.state === "alive") continue;
    const c = num(x.since_unix_ms) - num(x.unheard_for_ms);
    if (c > 0 && (t === 0 || c < t)) t = c;
  }
  return t || num(b.failed_unix_ms);
}

// isDown: a broker failed over and not registered again since (its old
// epoch is fenced): its streams serve elsewhere, the broker itself is down.
function isDown(b) {
  return !!b.fenced;
}

// troubleRank orders the brokers: what needs a person first.
function troubleRank(b, holds) {
  if (b.state === "failed" || b.state === "suspect") return 0;
  if ((holds[b.broker_id] || []).length) return 0;
  if (b.state === "recovering") return 1;
  if (isDown(b)) return 2;
  if ((b.observations || []).some((x) => x.state !== "alive")) return 3;
  if (b.state === "maintenance") return 4;
  return 5;
}

function renderBrokers(o) {
  const holds = o.holds || {};
  const now = num(o.now_unix_ms);
  const list = (o.brokers || []).slice().sort((a, b) => troubleRank(a, holds) - troubleRank(b, holds) || a.broker_id.localeCompare(b.broker_id));
  replaceRows($("#brokers tbody"), list.map((b) => {
    const obs = (b.observations || []).map((x) => el("span", { class: "obs obs-" + x.state, title: x.reason || "" },
      x.observer_id + ": " + x.state + (x.state !== "alive" ? " for " + duration(now - num(x.since_unix_ms)) : "")));
    const why = (holds[b.broker_id] || []).map((h) => el("li", {}, h));
    const hist = ((o.history || {})[b.broker_id] || []).map((t, i, all) => el("span", { class: "hist", "data-state": t.state, title: clock(t.unix_ms) },
      i === 0 ? "" : " → ", badge(t.state), " ", i === 0 ? clock(t.unix_ms).slice(11, 19) : "+" + duration(num(t.unix_ms) - num(all[i - 1].unix_ms))));
    const down = isDown(b) ? lastContact(b) : 0;
    const rank = troubleRank(b, holds);
    return el("tr", { "data-broker": b.broker_id, "data-state": b.state, "data-trouble": String(rank < 5), class: rank < 5 ? "trouble" : "" },
      el("td", {}, b.broker_id),
      el("td", { class: "state-cell" }, badge(b.state), isDown(b) ? el("span", { class: "badge state-down", "data-down": "true" }, "down") : null,
        isDown(b) ? el("div", { class: "down-since" }, "down since " + (down ? clock(down).slice(11, 19) + " (" + duration(now - down) + ")" : "its failover") + ": not registered again") : null,
        b.maintenance && (b.maintenance_reason || num(b.maintenance_until_unix_ms))
          ? el("div", { class: "muted" }, (b.maintenance_reason || "") + (num(b.maintenance_until_unix_ms) ? " (until about " + clock(b.maintenance_until_unix_ms).slice(11, 19) + ")" : " (no ttl)")) : null),
      el("td", { class: "why" }, why.length ? el("ul", { class: "holds" }, ...why) : "-"),
      el("td", { class: "views" }, ...(obs.length ? obs : ["-"])),
      el("td", {}, lease(b.lease_remaining_ms)),
      el("td", { class: "num" }, b.epoch),
      el("td", { class: "num" }, b.failovers),
      el("td", { class: "history" }, ...(hist.length ? hist : ["-"])));
  }));
}

// renderAttention lists what needs a person, most urgent first: brokers
// suspect or failed and why they are not failed over yet, automatic
// failover frozen, coordinators that do not commit, recoveries that failed
// or wait, brokers down since their failover, brokers in maintenance.
function renderAttention(o) {
  const st = o.status || {};
  const holds = o.holds || {};
  const now = num(o.now_unix_ms);
  const items = [];
  const add = (kind, id, urgent, ...text) => items.push({ kind, id, urgent, node: el("li", { class: "attention-" + kind + (urgent ? " urgent" : ""), "data-kind": kind, "data-id": id }, ...text) });
  const brokers = o.brokers || [];
  const frozen = brokers.find((b) => b.hold === "frozen");
  if (frozen) {
    const why = ((holds[frozen.broker_id] || [])[0] || "").replace(/^frozen: /, "").replace(/^automatic failover is frozen: /, "");
    add("frozen", "policy", true, el("b", {}, "automatic failover is frozen"), ": " + (why || "too many brokers look failed at once") +
      " (failover by hand: waldenctl failover BROKER --reason ...)");
  }
  for (const b of brokers) {
    const why = holds[b.broker_id] || [];
    if (b.state === "suspect" || b.state === "failed" || why.length) {
      const since = lastContact(b);
      add("broker", b.broker_id, true, el("b", {}, "broker " + b.broker_id), " " + b.state + (since ? ", not heard for " + duration(now - since) : ""),
        why.length ? ": " + why.join("; ") : "");
    }
  }
  for (const m of st.members || []) {
    const h = memberHealth(m, st);
    if (h.kind === "down") add("member", m.id, true, el("b", {}, "coordinator " + m.id), " " + h.text + ": " + h.detail);
  }
  for (const j of o.jobs || []) {
    if (j.state === "failed" || j.state === "blocked" || ((j.state === "running" || j.state === "pending") && j.error)) {
      add("job", j.job_id, true, el("b", {}, "recovery " + j.job_id), " of broker " + j.broker_id + " " + j.state + (j.step ? " in step " + j.step : "") + (j.error ? ": " + j.error : ""));
    }
  }
  for (const b of brokers) {
    if (isDown(b)) {
      const since = lastContact(b);
      add("down", b.broker_id, false, el("b", {}, "broker " + b.broker_id), " down since " + (since ? clock(since).slice(11, 19) + " (" + duration(now - since) + ")" : "its failover") +
        ": failed over (" + b.state + "), its streams serve on other brokers; it has not registered again");
    }
    if (b.maintenance) {
      add("maintenance", b.broker_id, false, el("b", {}, "broker " + b.broker_id), " in maintenance" + (b.maintenance_reason ? " (" + b.maintenance_reason + ")" : "") +
        (num(b.maintenance_until_unix_ms) ? " until about " + clock(b.maintenance_until_unix_ms).slice(11, 19) : ", no ttl: automatic failover stays off until maintenance off"));
    }
  }
  items.sort((a, b) => Number(b.urgent) - Number(a.urgent));
  replaceRows($("#attention"), items.map((i) => i.node));
  $("#all-well").hidden = items.length > 0;
}

// rate returns the upload rate of job j in bytes per second over the last
// five seconds of samples, or the average of its upload step once done.
function rate(j, now) {
  const id = j.job_id;
  if (j.state !== "running" && j.state !== "pending") {
    const cps = j.checkpoints || [];
    const read = cps.find((c) => c.step === "read"), up = cps.find((c) => c.step === "upload");
    if (read && up && num(up.unix_ms) > num(read.unix_ms)) return num(j.bytes_total) / ((num(up.unix_ms) - num(read.unix_ms)) / 1000);
    return null;
  }
  const s = samples.get(id) || [];
  const b = num(j.bytes_uploaded);
  if (!s.length || s[s.length - 1].bytes !== b) s.push({ t: now, bytes: b });
  while (s.length > 1 && now - s[0].t > 5000) s.shift();
  samples.set(id, s);
  if (s.length < 2) return null;
  const first = s[0], last = s[s.length - 1];
  const dt = (now - first.t) / 1000;
  return dt > 0 ? (last.bytes - first.bytes) / dt : null;
}

function renderJobs(o) {
  const jobs = o.jobs || [];
  const now = num(o.now_unix_ms);
  $("#no-jobs").hidden = jobs.length > 0;
  // Jobs that need a person first, then the running ones, then the newest.
  const rank = (j) => (j.state === "failed" || j.state === "blocked" ? 0 : j.state === "running" || j.state === "pending" ? 1 : 2);
  const order = jobs.map((j, i) => [j, i]).sort((a, b) => rank(a[0]) - rank(b[0]) || b[1] - a[1]).map((x) => x[0]);
  replaceRows($("#jobs tbody"), order.map((j) => {
    const total = num(j.bytes_total), done = num(j.bytes_uploaded);
    const pct = total > 0 ? Math.min(100, (100 * done) / total) : (j.state === "succeeded" ? 100 : 0);
    const r = rate(j, now);
    let eta = "-";
    if (j.state === "succeeded") eta = "done";
    else if (r && r > 0 && total > done) eta = duration(((total - done) / r) * 1000);
    const bar = el("span", { class: "bar", title: pct.toFixed(0) + "%" }, el("span", {}));
    bar.firstChild.style.width = pct.toFixed(1) + "%";
    return el("tr", { "data-job": j.job_id, "data-state": j.state },
      el("td", {}, j.job_id),
      el("td", {}, j.broker_id),
      el("td", {}, badge(j.state)),
      el("td", {}, j.step || "-", j.error ? el("div", { class: "error-text" }, j.error) : null, targetReport(j)),
      el("td", {}, (j.assignee_id || "-") + (num(j.attempt) > 1 ? " (attempt " + j.attempt + ")" : "")),
      el("td", {}, bar, el("span", { class: "bar-text" }, bytes(done) + " / " + (total ? bytes(total) : "?"))),
      el("td", { class: "num" }, r ? bytes(r) + "/s" : "-"),
      el("td", { class: "num" }, eta),
      el("td", { class: "num" }, j.streams_closed + "/" + j.streams_total));
  }));
}

// targetReport is what the job's recovery target reports in its own terms
// (AutoMQ: the node and epoch failed over, the objects' ids, the streams'
// end offsets), null for walden's own recovery.
function targetReport(j) {
  const r = j.target_report;
  if (!r) return null;
  const objs = r.objects || [];
  const streams = r.streams || [];
  const ids = objs.map((o) => o.object_id + " " + (o.kind || "") + " " + (o.state || "")).join(", ");
  const ends = streams.map((s) => "stream " + s.stream_id + ": " + (s.end_offset_before || 0) + " → " + (s.end_offset_after || 0) +
    (s.closed ? " closed" : "") + (s.problem ? " (" + s.problem + ")" : "")).join("\n");
  const text = (r.target === "automq" ? "AutoMQ " : (r.target || "") + " ") + "node " + (r.node_id || 0) + " · epoch " + (r.node_epoch || 0) +
    " · " + objs.length + (objs.length === 1 ? " object" : " objects") + (r.wal_reset ? " · WAL reset" : "");
  return el("div", { class: "target-report", title: (ids ? "objects: " + ids + "\n" : "") + ends }, text);
}

function fact(label, value) {
  return [label + " ", el("b", {}, value), " · "];
}

async function drawTimeline(box, f, now) {
  const ends = (f.phases || []).map((p) => p.end_unix_ms).join(",");
  const running = (f.phases || []).some((p) => num(p.end_unix_ms) === 0);
  const version = f.state + "|" + (f.phases || []).length + "|" + ends + (running ? "|" + Math.floor(now / 1000) : "");
  if (svgVersions.get(f.id) === version && box.firstChild) return;
  svgVersions.set(f.id, version);
  const r = await fetch("api/failovers/" + encodeURIComponent(f.id) + "/timeline.svg", { cache: "no-store" });
  if (!r.ok) return;
  const doc = new DOMParser().parseFromString(await r.text(), "image/svg+xml");
  if (doc.documentElement.nodeName !== "svg") return;
  box.replaceChildren(document.importNode(doc.documentElement, true));
}

function renderFailovers(o) {
  const list = (o.failovers || []).slice().reverse();
  const now = num(o.now_unix_ms);
  $("#no-failovers").hidden = list.length > 0;
  const container = $("#failovers");
  const keep = new Set(list.map((f) => f.id));
  for (const card of [...container.children]) if (!keep.has(card.dataset.failover)) card.remove();
  let prev = null;
  for (const f of list) {
    let card = container.querySelector('[data-failover="' + CSS.escape(f.id) + '"]');
    if (!card) {
      card = el("div", { class: "failover", "data-failover": f.id }, el("h3", {}), el("p", { class: "facts" }), el("div", { class: "timeline-box" }));
    }
    if (prev ? prev.nextSibling !== card : container.firstChild !== card) {
      if (prev) prev.after(card); else container.prepend(card);
    }
    prev = card;
    card.dataset.state = f.state;
    // From the last contact with the broker (where the timeline starts).
    const starts = (f.phases || []).map((p) => num(p.start_unix_ms)).filter((t) => t > 0);
    const start = starts.length ? Math.min(...starts) : num(f.first_suspect_unix_ms) || num(f.decided_unix_ms);
    const end = num(f.reopened_unix_ms) || num(f.finished_unix_ms);
    card.querySelector("h3").replaceChildren(
      "broker " + f.broker_id + " · ", badge(f.state), " · epoch " + f.old_epoch + " → " + f.new_epoch,
      f.manual ? " · manual" : "");
    card.querySelector(".facts").replaceChildren(
      ...fact("decided by", f.decided_by || "?"),
      ...fact("recovered by", (f.assignees || []).join(" → ") || "-"),
      ...fact("uploaded", bytes(f.bytes_uploaded) + " in " + plural(num(f.objects), "object", "objects")),
      ...fact("streams closed", f.streams_closed + "/" + f.streams_total),
      ...fact("reopened", f.streams_reopened + "/" + f.streams_total),
      end && start ? "total " : "", end && start ? el("b", {}, duration(end - start)) : "running for " + duration(now - start),
      f.error ? el("div", { class: "error-text" }, f.error) : "");
    drawTimeline(card.querySelector(".timeline-box"), f, now).catch(() => {});
  }
}

function fillSelect(sel, values) {
  const cur = sel.value;
  const have = new Set([...sel.options].map((o) => o.value));
  for (const v of values) if (!have.has(v)) sel.append(el("option", { value: v }, v));
  sel.value = cur;
}

async function pollEvents() {
  const q = new URLSearchParams();
  for (const [k, id] of [["broker", "#filter-broker"], ["kind", "#filter-kind"], ["since", "#filter-since"], ["q", "#filter-text"]]) {
    const v = $(id).value;
    if (v) q.set(k, v);
  }
  q.set("limit", "200");
  const r = await getJSON("api/events?" + q);
  const evs = (r.events || []).slice().reverse();
  fillSelect($("#filter-kind"), [...new Set(evs.map((e) => e.kind))].sort());
  replaceRows($("#events tbody"), evs.map((e) => el("tr", { "data-kind": e.kind, "data-broker": e.broker_id || "" },
    el("td", { class: "num" }, e.index),
    el("td", { class: "num" }, clock(e.unix_ms)),
    el("td", {}, e.kind),
    el("td", {}, e.broker_id || "-"),
    el("td", {}, e.actor || "-"),
    el("td", {}, e.message))));
}

function showProblems(list) {
  const p = $("#problems");
  p.hidden = !list.length;
  p.textContent = list.join("; ");
}

async function poll() {
  try {
    const o = await getJSON("api/overview");
    lastOverview = o;
    renderHeader(o);
    renderAttention(o);
    renderBrokers(o);
    renderJobs(o);
    renderFailovers(o);
    fillSelect($("#filter-broker"), (o.brokers || []).map((b) => b.broker_id));
    await pollEvents();
    showProblems(o.problems || []);
  } catch (err) {
    showProblems(["this coordinator does not answer: " + err.message + " (retrying)"]);
  } finally {
    setTimeout(poll, POLL_MS);
  }
}

document.addEventListener("DOMContentLoaded", () => {
  for (const id of ["#filter-broker", "#filter-kind", "#filter-since", "#filter-text"]) {
    $(id).addEventListener("input", () => pollEvents().catch(() => {}));
  }
  $("#event-filters").addEventListener("submit", (e) => e.preventDefault());
  poll();
});
