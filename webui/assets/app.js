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
  replaceRows($("#members tbody"), members.map((m) => el("tr", { "data-member": m.id },
    el("td", {}, m.id),
    el("td", {}, badge(m.id === st.leader_id ? "leader" : m.role)),
    el("td", {}, m.reachable ? "yes" : "no"),
    el("td", { class: "num" }, m.match_index),
    el("td", {}, m.raft_addr),
    el("td", {}, m.admin_addr))));
}

function lease(ms) {
  ms = num(ms);
  if (ms < 0) return "-";
  if (ms === 0) return "expired";
  return duration(ms);
}

function renderBrokers(o) {
  const holds = o.holds || {};
  const now = num(o.now_unix_ms);
  replaceRows($("#brokers tbody"), (o.brokers || []).map((b) => {
    const obs = (b.observations || []).map((x) => el("span", { class: "obs obs-" + x.state, title: x.reason || "" },
      x.observer_id + ": " + x.state + (x.state !== "alive" ? " for " + duration(now - num(x.since_unix_ms)) : "")));
    const why = (holds[b.broker_id] || []).map((h) => el("li", {}, h));
    const hist = ((o.history || {})[b.broker_id] || []).map((t, i, all) => el("span", { class: "hist", "data-state": t.state, title: clock(t.unix_ms) },
      i === 0 ? "" : " → ", badge(t.state), " ", i === 0 ? clock(t.unix_ms).slice(11) : "+" + duration(num(t.unix_ms) - num(all[i - 1].unix_ms))));
    // An AutoMQ broker's node as its agent reported it at registration.
    const automq = b.automq ? el("div", { class: "muted automq" }, "AutoMQ node " + b.automq.node_id +
      (num(b.automq.node_epoch) ? " · epoch " + b.automq.node_epoch : "")) : null;
    return el("tr", { "data-broker": b.broker_id, "data-state": b.state },
      el("td", {}, b.broker_id, automq),
      el("td", {}, badge(b.state), b.maintenance && (b.maintenance_reason || num(b.maintenance_until_unix_ms))
        ? el("div", { class: "muted" }, (b.maintenance_reason || "") + (num(b.maintenance_until_unix_ms) ? " (until about " + clock(b.maintenance_until_unix_ms).slice(11, 19) + ")" : "")) : null),
      el("td", { class: "num" }, b.epoch),
      el("td", {}, lease(b.lease_remaining_ms)),
      el("td", {}, ...(obs.length ? obs : ["-"])),
      el("td", { class: "num" }, b.failovers),
      el("td", { class: "history" }, ...(hist.length ? hist : ["-"])),
      el("td", {}, why.length ? el("ul", { class: "holds" }, ...why) : "-"));
  }));
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
  replaceRows($("#jobs tbody"), jobs.slice().reverse().map((j) => {
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
      el("td", {}, j.step || "-", j.error ? el("div", { class: "error-text" }, j.error) : null),
      el("td", {}, (j.assignee_id || "-") + (num(j.attempt) > 1 ? " (attempt " + j.attempt + ")" : "")),
      el("td", {}, bar, el("span", { class: "bar-text" }, bytes(done) + " / " + (total ? bytes(total) : "?"))),
      el("td", { class: "num" }, r ? bytes(r) + "/s" : "-"),
      el("td", { class: "num" }, eta),
      el("td", { class: "num" }, j.streams_closed + "/" + j.streams_total));
  }));
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
    const start = num(f.first_suspect_unix_ms) || num(f.decided_unix_ms);
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
