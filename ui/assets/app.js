// pgwake dashboard: one EventSource per page, fed by the server's single
// LISTEN and the event log. Every value from the server is set with
// textContent, never as HTML.
"use strict";
(function () {
  const body = document.body;
  const prefix = body.dataset.prefix || "";
  const csrf = body.dataset.csrf || "";
  const readOnly = body.dataset.readonly === "true";
  const live = document.getElementById("live");
  // State after each event type (queue.StateAfter).
  const stateAfter = {
    enqueued: "pending", started: "running", succeeded: "succeeded", retry_scheduled: "pending",
    failed: "failed", cancelled: "cancelled", retried: "pending", snoozed: "pending",
  };
  const seen = new Set(); // event ids shown, to drop repeats after a resume
  const seenOrder = [];

  function el(tag, text, attrs) {
    const e = document.createElement(tag);
    if (text !== undefined && text !== null) e.textContent = String(text);
    for (const k in attrs || {}) e.setAttribute(k, attrs[k]);
    return e;
  }

  function fmtNum(q, field) {
    const v = q[field];
    return (q.estimated || []).includes(field) ? "~" + v : String(v);
  }

  // Overview: counters and sparklines.
  const queues = document.getElementById("queues");
  function actionCell(q) {
    const td = el("td", null, { "data-field": "action" });
    const verb = q.paused ? "resume" : "pause";
    const f = el("form", null, { method: "post", action: prefix + "/queues/" + encodeURIComponent(q.queue) + "/" + verb });
    f.appendChild(el("input", null, { type: "hidden", name: "csrf", value: csrf }));
    f.appendChild(el("button", verb, { type: "submit" }));
    td.appendChild(f);
    return td;
  }
  function applyStats(msg) {
    if (!queues) return;
    const tbody = queues.tBodies[0];
    const rows = {};
    for (const tr of Array.from(tbody.rows)) {
      if (tr.dataset.queue === undefined) { tr.remove(); continue; }
      rows[tr.dataset.queue] = tr;
    }
    const names = new Set();
    for (const q of msg.queues) {
      names.add(q.queue);
      let tr = rows[q.queue];
      if (!tr) {
        tr = el("tr", null, { "data-queue": q.queue });
        const name = el("td", null, { class: "q" });
        name.appendChild(el("a", q.queue, { href: prefix + "/jobs?queue=" + encodeURIComponent(q.queue) }));
        tr.appendChild(name);
        for (const f of ["pending", "scheduled", "running", "failed", "succeeded_last_minute", "oldest", "state"]) {
          tr.appendChild(el("td", "", { "data-field": f }));
        }
        if (!readOnly) tr.appendChild(actionCell(q));
        tbody.appendChild(tr);
      }
      const set = (f, v) => {
        const td = tr.querySelector('[data-field="' + f + '"]');
        if (td && td.textContent !== v) { td.textContent = v; td.dataset.changedAt = String(Date.now()); }
      };
      for (const f of ["pending", "scheduled", "failed", "succeeded_last_minute"]) set(f, fmtNum(q, f));
      set("running", String(q.running));
      set("oldest", q.oldest_pending_age_seconds.toFixed(1) + "s");
      set("state", q.paused ? "paused" : "active");
      if (!readOnly) {
        const btn = tr.querySelector('[data-field="action"] button');
        if (btn && btn.textContent !== (q.paused ? "resume" : "pause")) tr.replaceChild(actionCell(q), tr.querySelector('[data-field="action"]'));
      }
    }
    for (const name in rows) if (!names.has(name)) rows[name].remove();
    if (msg.queues.length === 0) {
      const tr = el("tr", null, { class: "empty" });
      tr.appendChild(el("td", "no queue has pending, running, failed or recently finished jobs", { colspan: "9" }));
      tbody.appendChild(tr);
    }
    queues.dataset.updatedAt = String(Date.now());
    spark("spark-throughput", "throughput-now", msg.samples, (s) => s.succeeded + s.failed, "/s");
    spark("spark-latency", "latency-now", msg.samples, (s) => s.latency_ms, " ms");
  }
  function spark(id, nowID, samples, val, unit) {
    const svg = document.getElementById(id);
    if (!svg || !samples) return;
    const end = Math.floor(Date.now() / 1000);
    const by = new Map(samples.map((s) => [s.at, s]));
    const vals = [];
    for (let t = end - 59; t <= end; t++) vals.push(by.has(t) ? val(by.get(t)) : 0);
    const top = Math.max(1, ...vals);
    const pts = vals.map((v, i) => (i * 240 / 59).toFixed(1) + "," + (38 - (v / top) * 36).toFixed(1));
    svg.querySelector("polyline").setAttribute("points", pts.join(" "));
    // Now is the last whole second (or this one while it is the first
    // busy one): the feed keeps busy seconds however old, and the newest
    // of them is not "now" once jobs stopped (TestBrowserThroughputNowFallsToZero).
    const recent = by.get(end - 1) || by.get(end);
    const last = recent ? val(recent) : 0;
    document.getElementById(nowID).textContent = (Math.round(last * 10) / 10) + unit + " (max " + (Math.round(top * 10) / 10) + ")";
  }

  const feed = document.getElementById("feed");
  function addFeed(e) {
    if (!feed) return;
    const li = el("li", null, { "data-event-id": String(e.id) });
    li.appendChild(el("span", new Date(e.at).toISOString().slice(11, 23) + " "));
    li.appendChild(el("a", "job " + e.job_id, { href: prefix + "/jobs/" + e.job_id }));
    li.appendChild(el("span", " " + e.type + " · " + e.queue + " · " + e.kind + " · attempt " + e.attempt));
    feed.insertBefore(li, feed.firstChild);
    while (feed.children.length > 50) feed.removeChild(feed.lastChild);
  }

  // Jobs page: states of listed jobs, count of new ones.
  const jobs = document.getElementById("jobs");
  let newJobs = 0;
  // listed reports whether the page's filters would list the job an
  // enqueued event names: a new job is pending, has no error yet, and must
  // be of the filtered queue and kind (TestBrowserNewJobsCountFollowsTheFilter).
  function listed(e) {
    const f = jobs.dataset;
    return (!f.state || f.state === stateAfter.enqueued) && !f.error &&
      (!f.queue || f.queue === e.queue) && (!f.kind || f.kind === e.kind);
  }
  function onJobsEvent(e) {
    if (!jobs) return;
    const tr = jobs.querySelector('tr[data-job-id="' + e.job_id + '"]');
    if (tr && stateAfter[e.type]) {
      tr.querySelector('[data-field="state"]').textContent = stateAfter[e.type];
    }
    // A job the page shows is not new: the stream replays from the page's
    // resume point, which the listed jobs may be past
    // (TestBrowserListedJobsAreNotNew).
    if (e.type === "enqueued" && !tr && jobs.dataset.first === "true" && listed(e)) {
      newJobs++;
      const n = document.getElementById("new-jobs");
      n.hidden = false;
      n.querySelector("span").textContent = String(newJobs);
    }
  }

  // Job page: its events appended, its state.
  const job = document.getElementById("job");
  // syncActions offers the actions the job's state allows, as the page
  // does when read: retry a failed job, cancel a pending or running one
  // (TestBrowserJobActionsFollowItsState).
  function syncActions(state) {
    const box = document.getElementById("actions");
    if (!box) return;
    for (const [verb, label, allowed] of [["retry", "Retry", state === "failed"],
      ["cancel", "Cancel", state === "pending" || state === "running"]]) {
      const btn = document.getElementById(verb);
      if (btn && !allowed) btn.closest("form").remove();
      if (!btn && allowed) {
        const f = el("form", null, { method: "post", action: prefix + "/jobs/" + job.dataset.jobId + "/" + verb });
        f.appendChild(el("input", null, { type: "hidden", name: "csrf", value: csrf }));
        f.appendChild(el("button", label, { type: "submit", id: verb }));
        box.appendChild(f);
      }
    }
  }
  function onJobEvent(e) {
    if (!job || String(e.job_id) !== job.dataset.jobId) return;
    // The job row and its events are read one after the other, so the
    // table may already hold an event the state above predates: the state
    // follows every event the stream delivers (in order, from the page's
    // resume point), and only the row is skipped when shown.
    const tbody = document.getElementById("events").tBodies[0];
    if (!tbody.querySelector('tr[data-event-id="' + e.id + '"]')) {
      const tr = el("tr", null, { "data-event-id": String(e.id) });
      for (const v of [e.id, new Date(e.at).toISOString().replace("T", " "), e.type, e.attempt, "(reload for data)"]) tr.appendChild(el("td", v));
      tbody.appendChild(tr);
    }
    const st = document.getElementById("state");
    if (st && stateAfter[e.type]) {
      st.textContent = stateAfter[e.type];
      syncActions(stateAfter[e.type]);
    }
    const att = document.getElementById("attempts");
    if (att) att.textContent = att.textContent.replace(/^\d+/, String(e.attempt));
  }

  if (!window.EventSource) return;
  // From the resume point the page was read at (reconnects send
  // Last-Event-ID instead).
  window.pgwakeStream = { lastMark: 0, lastId: Number(body.dataset.after), jobs: [], opens: 0 };
  function open(after) {
    const es = new EventSource(prefix + "/events" + (after >= 0 ? "?after=" + after : ""));
    es.onopen = () => { window.pgwakeStream.opens++; live.textContent = "live"; live.className = "live on"; };
    es.onerror = () => {
      live.textContent = "reconnecting"; live.className = "live off";
      // Refused (too many streams open, a restarting proxy): EventSource
      // gives up on an HTTP error, so open a new one later from the last
      // resume point seen.
      if (es.readyState === EventSource.CLOSED) setTimeout(() => open(window.pgwakeStream.lastId), 10000 + Math.random() * 5000);
    };
    const seenId = (m) => { if (m.lastEventId !== "") window.pgwakeStream.lastId = Number(m.lastEventId); };
    es.addEventListener("stats", (m) => applyStats(JSON.parse(m.data)));
    es.addEventListener("mark", (m) => { seenId(m); window.pgwakeStream.lastMark = Number(m.lastEventId); });
    es.addEventListener("reload", () => location.reload());
    es.addEventListener("job", (m) => {
      seenId(m);
      const e = JSON.parse(m.data);
      if (seen.has(e.id)) return;
      seen.add(e.id); seenOrder.push(e.id);
      if (seenOrder.length > 20000) seen.delete(seenOrder.shift());
      window.pgwakeStream.jobs.push(e.id);
      if (window.pgwakeStream.jobs.length > 100000) window.pgwakeStream.jobs.splice(0, 50000);
      addFeed(e);
      onJobsEvent(e);
      onJobEvent(e);
    });
    window.pgwakeStream.source = es;
  }
  open(window.pgwakeStream.lastId);
})();
