// The dashboard: polls /dashboard/feed, keeps the last HISTORY documents' differences and
// draws them; its knobs call the control routes with the token typed in, held in memory.
"use strict";
(function () {
  const HISTORY = 120;  // points kept per series (a minute at the feed's 0.5 s)
  const COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#17becf"];
  const $ = (sel, root) => (root || document).querySelector(sel);
  let token = "";
  let prev = null;       // the previous feed document
  let t0 = null;         // the first document's t: x = seconds since
  let polls = 0;
  const rows = new Map();     // "model/replica" -> {el, queue, latency, hist}
  const models = new Map();   // model -> {el, list}
  const overview = {answers: null, refusals: null, x: [], answers_s: new Map(), refusals_s: new Map()};

  $("#token").addEventListener("input", (e) => { token = e.target.value.trim(); });

  function say(text, error) {
    const m = $("#message");
    m.textContent = text;
    m.className = error ? "error" : "";
  }

  async function control(method, path, body) {
    const headers = {};
    if (token) headers["Authorization"] = "Bearer " + token;
    if (body !== undefined) headers["Content-Type"] = "application/json";
    const resp = await fetch(path, {method, headers, cache: "no-store",
                                    body: body === undefined ? undefined : JSON.stringify(body)});
    const text = await resp.text();
    if (!resp.ok) {
      let message = text;
      try { message = JSON.parse(text).error.message; } catch (_) { /* not the envelope */ }
      throw new Error(resp.status + ": " + message);
    }
    return text;
  }

  function act(label, method, path, body) {
    say(label + "…");
    control(method, path, body).then(
      () => { say(label + ": done"); poll(); },
      (err) => say(label + ": " + err.message, true));
  }

  // ---- charts --------------------------------------------------------------------------
  function chart(el, title, names, opts) {
    const width = Math.max(240, el.clientWidth || 300);
    const series = [{label: "s"}].concat(names.map((n, i) => Object.assign(
      {label: n, stroke: COLORS[i % COLORS.length], width: 1.5, spanGaps: true},
      (opts && opts.dash && opts.dash.includes(i)) ? {dash: [6, 4]} : {})));
    const data = [[]].concat(names.map(() => []));
    const u = new uPlot({width, height: 150, title, series,
                         scales: {x: {time: false}}, legend: {live: false},
                         axes: [{size: 28}, {size: 48}], cursor: {show: false}}, data, el);
    u.data_ = data;
    return u;
  }

  function push(u, x, ys) {
    const d = u.data_;
    d[0].push(x);
    ys.forEach((y, i) => d[i + 1].push(y));
    if (d[0].length > HISTORY) d.forEach((a) => a.shift());
    u.setData(d);
    const el = u.root.parentNode;  // what is drawn, for scripts and tests
    el.dataset.points = d[0].length;
    el.dataset.last = JSON.stringify(ys);
  }

  window.addEventListener("resize", () => {
    const all = [overview.answers, overview.refusals];
    rows.forEach((r) => all.push(r.queue, r.latency));
    all.forEach((u) => { if (u) u.setSize({width: Math.max(240, u.root.parentNode.clientWidth), height: 150}); });
  });

  // ---- one model, one replica ----------------------------------------------------------
  function modelCard(model) {
    let m = models.get(model);
    if (m) return m;
    const el = document.createElement("div");
    el.className = "model";
    el.dataset.model = model;
    el.innerHTML = `<h2></h2>
      <div class="knobs">
        <form class="capacity">max_num_seqs <input name="max_num_seqs" type="number" min="1">
          max_waiting <input name="max_waiting" type="number" min="0">
          <span class="rank-pick">rank <input name="rank" type="number" min="0" placeholder="all"></span>
          <button type="submit">Apply</button></form>
        <form class="scale">replicas <input name="replicas" type="number" min="0" max="64">
          <button type="submit">Scale</button></form>
      </div>
      <div class="replicas"></div>`;
    $("h2", el).textContent = model;
    $("form.capacity", el).addEventListener("submit", (e) => {
      e.preventDefault();
      const f = e.target, body = {model};
      for (const k of ["max_num_seqs", "max_waiting", "rank"]) {
        if (f[k].value !== "") body[k] = Number(f[k].value);
      }
      act(`capacity of ${model}`, "POST", "/control/capacity", body);
    });
    $("form.scale", el).addEventListener("submit", (e) => {
      e.preventDefault();
      const n = e.target.replicas.value;
      if (n === "") return;
      act(`replicas of ${model}`, "POST", "/control/replicas", {model, replicas: Number(n)});
    });
    $("#models").appendChild(el);
    m = {el, list: $(".replicas", el), filled: false};
    models.set(model, m);
    return m;
  }

  function replicaCard(row) {
    const key = row.model + "/" + row.replica;
    let r = rows.get(key);
    if (r) return r;
    const m = modelCard(row.model);
    const el = document.createElement("div");
    el.className = "replica";
    el.dataset.key = key;
    el.dataset.replica = row.replica;
    el.innerHTML = `<h2>replica <span class="index"></span> <span class="state"></span></h2>
      <div class="numbers">
        <div><span>waiting / max_waiting</span><b class="waiting">0</b> / <b class="max_waiting"></b></div>
        <div><span>running / max_num_seqs</span><b class="running">0</b> / <b class="max_num_seqs"></b></div>
        <div><span>KV cache</span><b class="kv"></b></div>
        <div><span>tokens / s</span><b class="tokens">0</b></div>
        <div><span>update interval</span><b class="interval"></b></div>
        <div><span>tokens per write ≈</span><b class="per-write"></b></div>
      </div>
      <div class="chart queue"></div>
      <div class="chart latency"></div>
      <div class="knobs">
        <form class="fault"><select name="fault"><option>stall</option><option>slow</option>
          <option>crash</option><option>clear</option></select>
          <input name="seconds" type="number" min="0" step="0.5" value="5" title="seconds">s
          <input name="factor" type="number" min="1" step="0.5" value="4" title="slow factor">×
          <button type="submit">Fault</button></form>
        <span class="sleep-knobs"><button class="sleep" type="button">Sleep</button>
          <button class="wake" type="button">Wake</button></span>
      </div>`;
    $(".index", el).textContent = row.replica + (row.port ? ` (:${row.port})` : "");
    $("form.fault", el).addEventListener("submit", (e) => {
      e.preventDefault();
      const f = e.target, body = {fault: f.fault.value, replica: row.replica};
      if (body.fault === "stall" || body.fault === "slow") body.seconds = Number(f.seconds.value || 0);
      if (body.fault === "slow") body.factor = Number(f.factor.value || 2);
      act(`${body.fault} on replica ${row.replica}`, "POST", "/control/faults/replica", body);
    });
    // /sleep and /wake_up act on this port's replica (every replica on a port of none)
    $(".sleep", el).addEventListener("click", () => act("sleep", "POST", "/sleep?level=1"));
    $(".wake", el).addEventListener("click", () => act("wake", "POST", "/wake_up"));
    m.list.appendChild(el);
    r = {el, model: row.model,
         queue: chart($(".queue", el), "queue", ["waiting", "running", "max_num_seqs", "max_waiting"], {dash: [2, 3]}),
         latency: chart($(".latency", el), "recent mean latency, ms (modelled; dashed: gateway e2e)",
                        ["TTFT", "TPOT", "e2e", "gateway e2e"], {dash: [3]})};
    rows.set(key, r);
    return r;
  }

  // ---- differences between two documents -----------------------------------------------
  const mean = (now, before) => {
    const dn = now[1] - (before ? before[1] : 0);
    return dn > 0 ? (now[0] - (before ? before[0] : 0)) / dn : null;
  };
  const rate = (now, before, dt) => (before === undefined || dt <= 0) ? null : Math.max(0, now - before) / dt;
  const sumValues = (o) => Object.values(o || {}).reduce((a, b) => a + b, 0);
  const fmt = (v, digits) => (v === null || v === undefined) ? "–" : v.toFixed(digits);

  function update(doc) {
    if (t0 === null) t0 = doc.t;
    const x = Math.round((doc.t - t0) * 10) / 10;
    const dt = prev ? doc.t - prev.t : 0;
    const before = new Map((prev ? prev.replicas : []).map((r) => [r.model + "/" + r.replica, r]));
    const gwBefore = new Map((prev ? prev.gateway : []).map((g) => [String(g.replica), g]));
    const seen = new Set();
    const gwE2e = {};  // replica -> recent mean of the gateway's e2e on its port
    for (const g of doc.gateway) gwE2e[String(g.replica)] = mean(g.e2e_s, (gwBefore.get(String(g.replica)) || {}).e2e_s);
    for (const row of doc.replicas) {
      const key = row.model + "/" + row.replica;
      seen.add(key);
      const r = replicaCard(row), b = before.get(key);
      const m = models.get(row.model);
      if (!m.filled) {  // the knobs start at the live values
        const f = $("form.capacity", m.el);
        f.max_num_seqs.value = row.max_num_seqs;
        f.max_waiting.value = row.max_waiting;
        m.filled = true;
      }
      $(".rank-pick", m.el).hidden = !doc.data_parallel;
      $(".sleep-knobs", r.el).hidden = doc.replicas.length > 1 && row.replica !== 0 && !doc.data_parallel;
      const stalled = row.stalled_for_s > 0;
      const state = stalled ? `stalled ${row.stalled_for_s.toFixed(1)} s`
        : row.slow_factor !== 1 ? `slow ×${row.slow_factor}` : row.state;
      const st = $(".state", r.el);
      st.textContent = state;
      st.className = "state " + (stalled ? "stalled" : row.state);
      for (const k of ["waiting", "running", "max_num_seqs", "max_waiting"]) $("." + k, r.el).textContent = row[k];
      $(".kv", r.el).textContent = (100 * row.kv_cache_usage).toFixed(1) + " %";
      const tokens = rate(row.generation_tokens, b && b.generation_tokens, dt);
      const held = rate(row.coalesced_updates, b && b.coalesced_updates, dt);
      $(".tokens", r.el).textContent = fmt(tokens, 0);
      $(".interval", r.el).textContent = row.update_interval_s > 0 ? (1000 * row.update_interval_s).toFixed(1) + " ms" : "every step";
      // writes ≈ tokens minus the updates held back to go with a later one
      $(".per-write", r.el).textContent = (tokens && tokens > (held || 0)) ? fmt(tokens / (tokens - (held || 0)), 2) : "–";
      push(r.queue, x, [row.waiting, row.running, row.max_num_seqs, row.max_waiting || null]);
      const ms = (v) => v === null ? null : 1000 * v;
      const gw = gwE2e[String(row.replica)] !== undefined ? gwE2e[String(row.replica)] : gwE2e["null"];
      push(r.latency, x, [ms(mean(row.ttft_s, b && b.ttft_s)), ms(mean(row.tpot_s, b && b.tpot_s)),
                          ms(mean(row.e2e_s, b && b.e2e_s)), ms(gw === undefined ? null : gw)]);
    }
    for (const [key, r] of rows) {  // replicas gone (drained and closed)
      if (!seen.has(key)) { r.queue.destroy(); r.latency.destroy(); r.el.remove(); rows.delete(key); }
    }
    for (const [model, m] of models) {
      if (!doc.replicas.some((row) => row.model === model)) { m.el.remove(); models.delete(model); }
    }
    // the overview: answers by status (every port), engine refusals by reason (every replica)
    const answers = {}, refusals = {};
    for (const g of doc.gateway) {
      const gb = gwBefore.get(String(g.replica));
      for (const [status, n] of Object.entries(g.answered)) {
        if (gb) answers[status] = (answers[status] || 0) + Math.max(0, n - (gb.answered[status] || 0));
      }
    }
    for (const row of doc.replicas) {
      const b = before.get(row.model + "/" + row.replica);
      for (const [reason, n] of Object.entries(row.rejections)) {
        if (b) refusals[reason] = (refusals[reason] || 0) + Math.max(0, n - (b.rejections[reason] || 0));
      }
    }
    if (prev && dt > 0) {
      plotOverview("answers", "#answers-chart", answers, dt, x);
      plotOverview("refusals", "#refusals-chart", refusals, dt, x);
    }
    prev = doc;
  }

  function plotOverview(name, sel, counts, dt, x) {
    const keys = Object.keys(counts).sort();
    const have = overview[name];
    const names = have ? have.series.slice(1).map((s) => s.label) : [];
    if (!have || keys.some((k) => !names.includes(k))) {  // a new status: a new chart
      const all = Array.from(new Set(names.concat(keys))).sort();
      const el = $(sel);
      const old = have ? have.data_ : null;
      if (have) have.destroy();
      el.textContent = "";
      overview[name] = chart(el, null, all.length ? all : ["none"]);
      if (old) {  // keep what was drawn
        const d = overview[name].data_;
        d[0].push(...old[0]);
        all.forEach((k, i) => { const j = names.indexOf(k); d[i + 1].push(...(j >= 0 ? old[j + 1] : old[0].map(() => null))); });
      }
    }
    const u = overview[name];
    const labels = u.series.slice(1).map((s) => s.label);
    push(u, x, labels.map((k) => (counts[k] || 0) / dt));
  }

  // ---- the poll --------------------------------------------------------------------------
  let timer = null, inflight = false, every = 500;
  async function poll() {
    if (inflight) return;
    inflight = true;
    const status = $("#status");
    try {
      const resp = await fetch("/dashboard/feed", {cache: "no-store"});
      if (!resp.ok) throw new Error("feed: " + resp.status);
      const doc = await resp.json();
      update(doc);
      polls += 1;
      status.dataset.polls = polls;
      status.textContent = "live";
      status.className = "live";
      const wanted = Math.round(1000 * (doc.poll_s || 0.5));
      if (wanted !== every) { every = wanted; $("#poll").textContent = doc.poll_s; restart(); }
    } catch (err) {
      status.textContent = "no feed (" + err.message + ")";
      status.className = "down";
    } finally {
      inflight = false;
    }
  }
  function restart() { if (timer) clearInterval(timer); timer = setInterval(poll, every); }
  restart();
  poll();
})();
