/* specq's web page (/ui): jobs, batches, workers, and what the target saw of each document.
 *
 * Plain JavaScript, no build step, no library, no CDN: the API serves this file, app.css and the
 * page shell (specq/api/ui.py), under `Content-Security-Policy: default-src 'self'`, so nothing inline
 * runs. Every piece of user text (documents, questions, answers, file names, errors) reaches the page
 * as a text node or an attribute value set through the DOM, never as HTML; links are built here from
 * ids and point only at this origin.
 *
 * With SPECQ_AUTH=keys the page asks for a key, keeps it in sessionStorage (this tab only) and sends it
 * as `Authorization: Bearer`; the API filters every read to the key's tenant.
 *
 * Live updates go through `live` (below): lists poll; a job page reads GET /v1/jobs/{id}/events
 * (server-sent events, read with fetch so the key can be sent) when the API has it, and polls
 * otherwise. `documentElement.dataset.ready` names the page once it is drawn (tests wait on it), and
 * `window.specqRenderedAt` holds performance.now() at that moment.
 */
"use strict";
(() => {
  const KEY = "specq.key";
  const AUTH = (document.querySelector('meta[name="specq-auth"]') || {}).content || "none";
  const JOB_TERMINAL = new Set(["succeeded", "failed", "cancelled"]);
  const BATCH_TERMINAL = new Set(["completed", "failed", "expired", "cancelled"]);
  const JOB_STATUSES = ["queued", "running", "succeeded", "failed", "cancelled"];
  const BATCH_STATUSES = ["validating", "in_progress", "finalizing", "completed", "failed", "expired", "cancelling", "cancelled"];
  const PHASE_ORDER = ["queue_wait", "tokenize", "score", "speculator_prefill", "lookahead", "score_math", "select",
    "sparse_prefill", "ttft", "decode", "total"];
  /** display labels only: the API's phase names stay as docs/result.md defines them. `sparse_prefill` is
   *  the target's prefill in every mode (sparse only when specprefill ran: `phaseLabel`). */
  const PHASE_LABELS = { queue_wait: "queue wait", tokenize: "tokenize", score: "scoring", select: "select",
    sparse_prefill: "target prefill", decode: "decode", other: "other", speculator_prefill: "speculator prefill",
    lookahead: "lookahead", score_math: "score math", ttft: "TTFT", total: "total", cache_restore: "cache restore" };
  /** what progress counts in each phase */
  const PHASE_UNITS = { score: "windows", sparse_prefill: "tokens", decode: "tokens" };
  const POLL_LIST_MS = 1500, POLL_JOB_MS = 700, POLL_WORKERS_MS = 3000;
  /** a heartbeat older than this (seconds; workers beat every 5) is shown as stale */
  const STALE_S = 15;

  // --- DOM ----------------------------------------------------------------------------------------------
  /** An element; props: class, text, href (same-origin paths only), on<event>, dataset, other attributes.
   *  Children: nodes, or anything else as text. */
  function h(tag, props, ...kids) {
    const el = document.createElement(tag);
    for (const [k, v] of Object.entries(props || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "class") el.className = v;
      else if (k === "text") el.textContent = String(v);
      else if (k === "href") el.setAttribute("href", localHref(v));
      else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
      else if (k === "dataset") Object.assign(el.dataset, v);
      else el.setAttribute(k, String(v));
    }
    for (const kid of kids.flat(Infinity)) {
      if (kid === null || kid === undefined || kid === false) continue;
      el.append(kid instanceof Node ? kid : String(kid));
    }
    return el;
  }
  /** Only paths of this origin ("/…", not "//…"): nothing the API returns becomes a link target. */
  function localHref(v) { return typeof v === "string" && /^\/(?![\/\\])/.test(v) ? v : "#"; }
  const enc = encodeURIComponent;
  const jobHref = (id) => `/ui/jobs/${enc(id)}`;
  const batchHref = (id) => `/ui/batches/${enc(id)}`;
  function navLink(href, ...kids) { return h("a", { href, dataset: { nav: "1" } }, ...kids); }

  // --- formatting ----------------------------------------------------------------------------------------
  function fmtMs(ms) {
    if (ms === null || ms === undefined || !isFinite(ms)) return "–";
    if (ms < 1) return `${ms.toFixed(2)} ms`;
    if (ms < 1000) return `${ms.toFixed(ms < 10 ? 1 : 0)} ms`;
    if (ms < 60000) return `${(ms / 1000).toFixed(2)} s`;
    const m = Math.floor(ms / 60000);
    return `${m} min ${Math.round((ms - m * 60000) / 1000)} s`;
  }
  /** A time the API gives: ISO 8601 text (jobs) or Unix seconds (batches, as OpenAI's objects have them). */
  function toDate(value) {
    if (value === null || value === undefined || value === "") return null;
    const d = typeof value === "number" ? new Date(value * 1000) : new Date(value);
    return isNaN(d) ? null : d;
  }
  /** "2026-12-06 04:12:33 UTC": date, time and time zone, in this browser's zone. */
  function fmtTime(value) {
    const d = toDate(value);
    if (!d) return value === null || value === undefined || value === "" ? "–" : String(value);
    const p2 = (n) => String(n).padStart(2, "0");
    const zone = (new Intl.DateTimeFormat(undefined, { timeZoneName: "short" }).formatToParts(d)
      .find((x) => x.type === "timeZoneName") || {}).value || "";
    return `${d.getFullYear()}-${p2(d.getMonth() + 1)}-${p2(d.getDate())} ${p2(d.getHours())}:${p2(d.getMinutes())}:`
      + `${p2(d.getSeconds())}${zone ? ` ${zone}` : ""}`;
  }
  /** fmtTime as a <time> element whose `datetime` is the instant in UTC. */
  function timeEl(value) {
    const d = toDate(value);
    return d ? h("time", { datetime: d.toISOString() }, fmtTime(value)) : fmtTime(value);
  }
  /** "41 s", "2 min 5 s", "1 h 3 min" */
  function fmtDuration(s) {
    if (!isFinite(s) || s < 0) return "–";
    if (s < 60) return `${Math.round(s)} s`;
    if (s < 3600) return `${Math.floor(s / 60)} min ${Math.round(s % 60)} s`;
    return `${Math.floor(s / 3600)} h ${Math.round((s % 3600) / 60)} min`;
  }
  function fmtNum(x, digits = 0) {
    return x === null || x === undefined || !isFinite(x) ? "–" : Number(x).toLocaleString(undefined, { maximumFractionDigits: digits });
  }
  function fmtPct(x) { return x === null || x === undefined || !isFinite(x) ? "–" : `${(100 * x).toFixed(1)}%`; }
  function spanMs(a, b) { return a && b ? new Date(b) - new Date(a) : null; }
  function badge(status) { return h("span", { class: `badge ${status}`, dataset: { status } }, String(status).replace("_", " ")); }
  function bar(frac, cls) {
    const fill = h("span", { class: cls || "" });
    fill.style.width = `${Math.max(0, Math.min(1, frac || 0)) * 100}%`;
    return h("span", { class: "bar" }, fill);
  }
  function kv(rows) {
    return h("table", { class: "kv" }, rows.filter(Boolean).map(([k, v]) => h("tr", {}, h("th", {}, k), h("td", {}, v))));
  }

  // --- the API ---------------------------------------------------------------------------------------------
  class ApiError extends Error {
    constructor(status, message, type) { super(message); this.status = status; this.type = type; }
  }
  function authHeaders() {
    const key = sessionStorage.getItem(KEY);
    return key ? { Authorization: `Bearer ${key}` } : {};
  }
  async function api(path, { signal, method = "GET", accept = "application/json" } = {}) {
    const r = await fetch(path, { method, headers: { Accept: accept, ...authHeaders() }, cache: "no-store", signal });
    if (r.status === 401 && AUTH === "keys") {
      sessionStorage.removeItem(KEY);
      showLogin("the key was refused (unknown or revoked): enter another");
      throw new ApiError(401, "unauthorized", "unauthorized");
    }
    if (accept !== "application/json") return r;
    const body = await r.json().catch(() => null);
    if (!r.ok) throw new ApiError(r.status, (body && body.error && body.error.message) || r.statusText, body && body.error && body.error.type);
    return body;
  }
  /** Save a download through fetch (so the key is sent) as a file named `name`. */
  async function download(path, name) {
    const r = await api(path, { accept: "*/*" });
    if (!r.ok) { alert(`download failed: ${r.status}`); return; }
    const url = URL.createObjectURL(await r.blob());
    const a = h("a", {}); a.href = url; a.download = name;
    document.body.append(a); a.click(); a.remove();
    setTimeout(() => URL.revokeObjectURL(url), 10000);
  }
  function downloadLink(path, name, label) {
    return h("a", { href: path, onclick: (e) => { if (AUTH === "keys") { e.preventDefault(); download(path, name); } } }, label);
  }

  // --- live updates (swappable transport) ---------------------------------------------------------------
  const live = {
    /** null: not tried yet; false: the API has no event stream (poll); true: it has */
    sse: null,
    /** Call onJob(job) with the job as it changes until it ends (and once more at the end); onText(text)
     *  with the answer so far while it is decoded, if the event stream sends it. Returns stop(). */
    watchJob(id, { onJob, onText, onMissing }) {
      const ctl = new AbortController();
      let stopped = false, timer = null;
      const stop = () => { stopped = true; ctl.abort(); clearTimeout(timer); };
      const fetchJob = async () => {
        try {
          const job = await api(`/v1/jobs/${enc(id)}`, { signal: ctl.signal });
          if (!stopped) onJob(job);
          return job;
        } catch (e) {
          if (e.status === 404 && onMissing) { onMissing(e); stop(); }
          if (e.name !== "AbortError" && e.status !== 404) console.warn("specq:", e.message);
          return null;
        }
      };
      const poll = async () => {
        while (!stopped) {
          const job = await fetchJob();
          if (!job || JOB_TERMINAL.has(job.status) || stopped) { if (job) stop(); return; }
          await new Promise((r) => { timer = setTimeout(r, document.hidden ? 3000 : POLL_JOB_MS); });
        }
      };
      (async () => {
        const first = await fetchJob();
        if (!first || stopped) return;
        if (JOB_TERMINAL.has(first.status)) { stop(); return; }
        if (await live.stream(id, ctl.signal, fetchJob, onText)) {
          if (!stopped) { const job = await fetchJob(); if (job && JOB_TERMINAL.has(job.status)) { stop(); return; } }
        }
        poll();
      })();
      return stop;
    },
    /** Does this API serve GET /v1/jobs/{id}/events? Asked once per page load, from /openapi.json
     *  (probing the route itself would log a 404 in the console wherever it does not exist). */
    async hasEvents() {
      if (live.sse === null) {
        try {
          const r = await fetch("/openapi.json", { cache: "no-store" });
          const spec = r.ok ? await r.json() : {};
          live.sse = Boolean(spec.paths && spec.paths["/v1/jobs/{job_id}/events"]);
        } catch (e) { live.sse = false; }
      }
      return live.sse;
    },
    /** Read the job's event stream; false if the API has none (then polling takes over). */
    async stream(id, signal, refresh, onText) {
      if (!(await live.hasEvents())) return false;
      let r;
      try {
        r = await api(`/v1/jobs/${enc(id)}/events`, { signal, accept: "text/event-stream" });
      } catch (e) { return false; }
      const type = (r.headers.get("content-type") || "").split(";")[0].trim();
      if (!r.ok || type !== "text/event-stream" || !r.body) return false;
      let answer = "", pending = null;
      const soon = () => { if (!pending) pending = setTimeout(() => { pending = null; refresh(); }, 250); };
      const handle = (event, data) => {
        let d = null;
        try { d = JSON.parse(data); } catch (e) { /* not JSON: just refresh */ }
        if (event === "delta" && d && typeof d.text === "string") {
          const at = Number.isInteger(d.offset) ? d.offset : answer.length;
          answer = answer.slice(0, at) + d.text;
          if (onText) onText(answer);
        } else if (event === "reset") {
          answer = ""; if (onText) onText(answer);
        } else soon();
      };
      const reader = r.body.pipeThrough(new TextDecoderStream()).getReader();
      let buf = "";
      try {
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          buf += value.replace(/\r\n?/g, "\n");
          let cut;
          while ((cut = buf.indexOf("\n\n")) >= 0) {
            const block = buf.slice(0, cut); buf = buf.slice(cut + 2);
            let event = "message"; const data = [];
            for (const line of block.split("\n")) {
              if (line.startsWith("event:")) event = line.slice(6).trim();
              else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
            }
            if (data.length || event !== "message") handle(event, data.join("\n"));
          }
        }
      } catch (e) { if (e.name !== "AbortError") console.warn("specq: event stream:", e.message); }
      clearTimeout(pending);
      return true;
    },
    /** Call fn() now and every `ms` (slower while the tab is hidden) until stop() or fn returns false. */
    every(ms, fn) {
      let stopped = false, timer = null;
      const tick = async () => {
        if (stopped) return;
        let again = true;
        try { again = (await fn()) !== false; } catch (e) { if (e.status !== 401) console.warn("specq:", e.message); }
        if (!stopped && again) timer = setTimeout(tick, document.hidden ? Math.max(ms, 5000) : ms);
      };
      tick();
      return () => { stopped = true; clearTimeout(timer); };
    },
  };

  // --- page frame, routing, login ------------------------------------------------------------------------
  const main = document.getElementById("main");
  let stopPage = () => {};

  function frame() {
    const here = location.pathname;
    const link = (href, label, match) => h("a", { href, dataset: { nav: "1" }, class: match.test(here) ? "here" : null }, label);
    const key = sessionStorage.getItem(KEY);
    const top = h("header", { class: "top" },
      h("span", { class: "brand" }, "specq"),
      h("nav", {},
        link("/ui/jobs", "Jobs", /^\/ui(\/jobs.*)?\/?$/),
        link("/ui/batches", "Batches", /^\/ui\/batches/),
        link("/ui/workers", "Workers", /^\/ui\/workers/),
        link("/ui/evidence", "Evidence", /^\/ui\/evidence/),
        h("a", { href: "/docs" }, "API docs")),
      AUTH === "keys" && key ? h("span", { class: "who" }, `key …${key.slice(-4)}`,
        h("button", { type: "button", onclick: () => { sessionStorage.removeItem(KEY); showLogin(); } }, "Sign out")) : null);
    document.querySelector("header.top")?.remove();
    document.body.prepend(top);
  }

  function ready(name) {
    requestAnimationFrame(() => setTimeout(() => {
      window.specqRenderedAt = performance.now();
      document.documentElement.dataset.ready = name;
    }, 0));
  }

  function showLogin(message) {
    stopPage(); stopPage = () => {};
    frame();
    const input = h("input", { type: "password", name: "key", autocomplete: "off", placeholder: "sk-specq-…", "aria-label": "API key" });
    const note = h("div", { class: "err" }, message || "");
    const form = h("form", {
      onsubmit: async (e) => {
        e.preventDefault();
        const key = input.value.trim();
        if (!key) return;
        sessionStorage.setItem(KEY, key);
        try {
          await api("/v1/jobs?limit=1");
          route();
        } catch (err) {
          if (err.status !== 401) { note.textContent = err.message; }
        }
      },
    }, h("label", {}, "API key"), input, h("button", { class: "primary", type: "submit" }, "Sign in"), note);
    main.replaceChildren(h("div", { class: "card login", dataset: { role: "login" } },
      h("h1", {}, "Sign in"),
      h("p", { class: "muted" }, "This specq asks for an API key (SPECQ_AUTH=keys). It is kept in this tab's session storage "
        + "and sent as a Bearer token; you see your tenant's jobs only."), form));
    document.documentElement.dataset.ready = "login";
    input.focus();
  }

  const ROUTES = [
    [/^\/ui\/?$/, () => jobsPage],
    [/^\/ui\/jobs\/?$/, () => jobsPage],
    [/^\/ui\/jobs\/([^/]+)\/?$/, () => jobPage],
    [/^\/ui\/batches\/?$/, () => batchesPage],
    [/^\/ui\/batches\/([^/]+)\/?$/, () => batchPage],
    [/^\/ui\/workers\/?$/, () => workersPage],
    [/^\/ui\/evidence\/?$/, () => evidencePage],
  ];

  function route() {
    stopPage(); stopPage = () => {};
    delete document.documentElement.dataset.ready;
    if (AUTH === "keys" && !sessionStorage.getItem(KEY)) { showLogin(); return; }
    frame();
    const path = location.pathname;
    const query = new URLSearchParams(location.search);
    for (const [re, page] of ROUTES) {
      const m = path.match(re);
      if (m) {
        const stops = page()(main, m.slice(1).map(decodeURIComponent), query);
        stopPage = typeof stops === "function" ? stops : () => {};
        return;
      }
    }
    main.replaceChildren(h("div", { class: "card notfound" }, "not found: no such page"));
    ready("notfound");
  }

  document.addEventListener("click", (e) => {
    const a = e.target.closest && e.target.closest("a[data-nav]");
    if (!a || e.ctrlKey || e.metaKey || e.shiftKey || e.button !== 0) return;
    e.preventDefault();
    history.pushState(null, "", a.getAttribute("href"));
    route();
  });
  window.addEventListener("popstate", route);

  function setQuery(params) {
    const q = new URLSearchParams();
    for (const [k, v] of Object.entries(params)) if (v !== "" && v !== null && v !== undefined && v !== 0) q.set(k, v);
    const s = q.toString();
    history.replaceState(null, "", location.pathname + (s ? `?${s}` : ""));
  }

  function failure(e) {
    return h("div", { class: "card notfound", dataset: { role: "error" } }, e.status === 404 ? "not found" : `could not load: ${e.message}`);
  }

  // --- jobs --------------------------------------------------------------------------------------------------
  /** What a phase did, for people: the target's prefill is a "sparse prefill" only where specprefill
   *  ran; a running job's (mode not known yet) is a "prefill". */
  function phaseLabel(phase, result) {
    if (phase === "sparse_prefill") {
      const mode = ((result || {}).spec || {}).mode;
      return mode === "specprefill" ? "sparse prefill" : "prefill";
    }
    return PHASE_LABELS[phase] || phase;
  }

  /** Where each running job's current phase was first seen by this page: {phase, at (ms), done}; the
   *  rate since then gives the estimate of the time left. */
  const phaseSeen = new Map();
  function progressText(job) {
    const p = job.progress || {};
    const label = p.phase ? phaseLabel(p.phase) : "starting";
    const started = toDate(job.started_at);
    const elapsed = started ? ` · ${fmtDuration(Math.max(0, Date.now() - started) / 1000)} elapsed` : "";
    if (!(p.total > 1)) return `${label}${elapsed}`;
    const now = performance.now();
    let seen = phaseSeen.get(job.id);
    if (!seen || seen.phase !== p.phase || p.done < seen.done) { seen = { phase: p.phase, at: now, done: p.done }; phaseSeen.set(job.id, seen); }
    const rate = (p.done - seen.done) / ((now - seen.at) / 1000);
    const eta = rate > 0 && p.done < p.total ? ` · ~${fmtDuration((p.total - p.done) / rate)} left` : "";
    return `${label} ${fmtNum(p.done)}/${fmtNum(p.total)} ${PHASE_UNITS[p.phase] || ""}`.trimEnd() + elapsed + eta;
  }

  function progressCell(job) {
    const p = job.progress || {};
    if (job.status === "running") {
      const frac = p.total ? p.done / p.total : 0;
      return [bar(frac), h("span", { class: "prog", dataset: { role: "progress" } }, progressText(job))];
    }
    if (job.status === "succeeded") return bar(1, "ok");
    if (job.status === "failed") return [bar(1, "bad"), cut((job.error || "").slice(0, 500), "error", "prog")];
    return "";
  }

  /** A cell's text cut to its column with "…", whole in its title (the list's columns are fixed so
   *  the table fits a 1,280 px window). */
  function cut(text, role, cls = "") {
    return text ? h("span", { class: `cut ${cls}`.trim(), title: text, dataset: { role } }, text) : "";
  }

  function jobRow(job) {
    const params = job.params || {};
    const run = spanMs(job.started_at, job.finished_at);
    const batchLabel = job.batch_name || job.batch_id;
    const custom = job.custom_id && job.custom_id !== job.filename ? job.custom_id : "";
    return [
      h("td", { class: "mono" }, navLink(jobHref(job.id), job.id), h("span", { class: "sub" }, timeEl(job.created_at))),
      h("td", {}, badge(job.status), progressCell(job)),
      h("td", {}, cut(job.filename, "file")),
      h("td", {}, job.question ? cut(job.question, "question") : cut(job.kind && job.kind !== "job" ? `(${job.kind})` : "", "question", "muted")),
      h("td", {}, job.batch_id ? [navLink(batchHref(job.batch_id), cut(batchLabel, "batch")), cut(custom, "custom-id", "sub")] : ""),
      h("td", {}, params.mode ? `${params.mode}${params.mode === "specprefill" && params.keep ? ` ${params.keep}` : ""}` : "auto"),
      h("td", { dataset: { role: "ran" } }, ranCell(job.ran)),
      h("td", { class: "num" }, run === null ? "–" : fmtMs(run),
        job.queue_wait_ms === null || job.queue_wait_ms === undefined ? "" : h("span", { class: "sub", title: "queue wait" }, `wait ${fmtMs(job.queue_wait_ms)}`)),
    ];
  }
  /** The jobs list (the jobs page, a batch's page): fixed column widths (app.css, table.jobs) so it
   *  fits 1,280 px whatever the file names, questions and reasons; `worker` is on the job's page. */
  const JOB_HEADERS = ["job", "status", "file", "question", "batch", "mode", "ran", "run time"];
  const JOB_TABLE = { cls: "jobs", cols: ["job", "status", "file", "question", "batch", "mode", "ran", "time"] };
  /** The mode that ran (`mode` is the one asked for) and, smaller, why. */
  function ranCell(ran) {
    if (!ran || !ran.mode) return "";
    return [h("span", { class: "ran-mode" }, ran.mode + (ran.cache_hit ? " (cache hit)" : "")),
      ran.reason ? h("span", { class: "reason muted", title: ran.reason }, ran.reason) : ""];
  }

  /** A table whose rows are keyed by id and redrawn only when what they show changed. */
  function liveTable(headers, rowCells, numeric = [], { cls = "", cols = null } = {}) {
    const tbody = h("tbody");
    const table = h("table", { class: `list ${cls}`.trim() },
      cols ? h("colgroup", {}, cols.map((c) => h("col", { class: `c-${c}` }))) : "",
      h("thead", {}, h("tr", {}, headers.map((t, i) => h("th", { class: numeric.includes(i) ? "num" : null }, t)))), tbody);
    const rows = new Map();
    return {
      table,
      update(items) {
        const seen = new Set();
        let prev = null;
        for (const item of items) {
          seen.add(item.id);
          const sig = JSON.stringify(item);
          let tr = rows.get(item.id);
          if (!tr) { tr = h("tr", { dataset: { id: item.id } }); rows.set(item.id, tr); }
          if (tr.dataset.sig !== sig) { tr.replaceChildren(...rowCells(item)); tr.dataset.sig = sig; tr.dataset.status = item.status || ""; }
          const want = prev ? prev.nextSibling : tbody.firstChild;
          if (want !== tr) tbody.insertBefore(tr, want);
          prev = tr;
        }
        for (const [id, tr] of rows) if (!seen.has(id)) { tr.remove(); rows.delete(id); }
      },
    };
  }

  /** A list polled every POLL_LIST_MS with the filters `keys` of `state` (plus limit and offset) as
   *  query parameters, paged by two buttons; `onList(list)` draws what the table does not. */
  function pagedList({ name, endpoint, state, keys, table, prevBtn, nextBtn, onList }) {
    let stop = () => {}, first = true;
    const restart = () => {
      stop();
      const shown = Object.fromEntries(keys.map((k) => [k, state[k]]));
      setQuery({ ...shown, limit: state.limit === 50 ? "" : state.limit, offset: state.offset });
      stop = live.every(POLL_LIST_MS, async () => {
        const q = new URLSearchParams({ limit: state.limit, offset: state.offset });
        for (const k of keys) if (state[k]) q.set(k, state[k]);
        const list = await api(`${endpoint}?${q}`);
        table.update(list.data);
        prevBtn.disabled = state.offset === 0;
        onList(list);
        if (first) { first = false; ready(name); }
      });
    };
    prevBtn.addEventListener("click", () => { state.offset = Math.max(0, state.offset - state.limit); restart(); });
    nextBtn.addEventListener("click", () => { state.offset += state.limit; restart(); });
    /** redraw from the first page when `input` changes state[key] */
    const filter = (input, key, parse = (v) => v.trim()) =>
      input.addEventListener("change", () => { state[key] = parse(input.value); state.offset = 0; restart(); });
    return { restart, filter, stop: () => stop() };
  }

  function pager() { return [h("button", { type: "button" }, "← newer"), h("button", { type: "button" }, "older →")]; }

  function jobsPage(root, _args, query) {
    const state = { status: query.get("status") || "", batch_id: query.get("batch_id") || "",
      limit: Number(query.get("limit")) || 50, offset: Number(query.get("offset")) || 0 };
    const status = h("select", { name: "status" }, h("option", { value: "" }, "all"), JOB_STATUSES.map((s) => h("option", { value: s }, s)));
    status.value = state.status;
    const batch = h("input", { type: "text", name: "batch_id", placeholder: "batch id", size: 30 });
    batch.value = state.batch_id;
    const limit = h("select", { name: "limit" }, [25, 50, 100, 200].map((n) => h("option", { value: n }, n)));
    limit.value = String(state.limit);
    const total = h("span", { class: "muted" });
    const [prevBtn, nextBtn] = pager();
    const table = liveTable(JOB_HEADERS, jobRow, [7], JOB_TABLE);
    const empty = h("div", { class: "muted" });
    root.replaceChildren(
      h("h1", {}, "Jobs"),
      h("div", { class: "filters" }, h("label", {}, "status ", status), h("label", {}, "batch ", batch),
        h("label", {}, "per page ", limit), total),
      table.table, empty, h("div", { class: "pager" }, prevBtn, nextBtn));
    const list = pagedList({ name: "jobs", endpoint: "/v1/jobs", state, keys: ["status", "batch_id"], table, prevBtn, nextBtn,
      onList: (page) => {
        total.textContent = `${fmtNum(page.total)} job${page.total === 1 ? "" : "s"}`
          + (page.total > page.data.length ? `, ${state.offset + 1}–${state.offset + page.data.length} shown` : "");
        empty.textContent = page.data.length ? "" : "no jobs" + (state.status ? ` with status ${state.status}` : "");
        nextBtn.disabled = state.offset + page.data.length >= page.total;
      } });
    list.filter(status, "status");
    list.filter(batch, "batch_id");
    list.filter(limit, "limit", Number);
    list.restart();
    return list.stop;
  }

  // --- one job -----------------------------------------------------------------------------------------------
  /** The stacked bar from queue to last token: [phase, ms, label] segments. */
  function phaseSegments(job, result) {
    const t = (result && result.timings_ms) || {};
    const spec = (result && result.spec) || {};
    const n = (x) => (typeof x === "number" && isFinite(x) && x > 0 ? x : 0);
    const windows = spec.windows ? ` · ${spec.windows} window${spec.windows === 1 ? "" : "s"}` : "";
    const segs = [
      ["queue_wait", n(job.queue_wait_ms), "queue wait"],
      ["tokenize", n(t.tokenize), "tokenize"],
      ["score", n(t.score), `scoring${windows}`],
      ["select", n(t.select), "select"],
      // in specprefill a restore is the speculator's windows, inside `score`; else the target's prompt prefix
      spec.mode !== "specprefill" ? ["cache_restore", n(t.cache_restore), "cache restore"] : null,
      ["sparse_prefill", n(t.sparse_prefill), phaseLabel("sparse_prefill", result)],
      ["decode", n(t.decode), "decode"],
    ].filter(Boolean);
    const inRun = segs.slice(1).reduce((a, s) => a + s[1], 0);
    const other = n(t.total) - inRun;
    if (other > 0.005 * n(t.total)) segs.push(["other", other, "other (prompt checks, drafter setup)"]);
    return segs;
  }

  /** One stacked bar of `segs` ([phase, ms, label]) scaled to their sum. */
  function stackedBar(segs, role) {
    const total = segs.reduce((a, s) => a + s[1], 0) || 1;
    const el = h("div", { class: "waterfall", dataset: { role } });
    for (const [phase, ms, label] of segs) {
      if (ms <= 0) continue;
      const seg = h("div", { class: `seg ph-${phase}`, title: `${label}: ${fmtMs(ms)}`, dataset: { phase, ms: String(ms) } });
      seg.style.width = `${(100 * ms) / total}%`;
      el.append(seg);
    }
    return el;
  }

  /** The scoring sub-phases as a thin bar under the scoring segment of a bar of `segs`. */
  function scoreBar(segs, t) {
    const total = segs.reduce((a, s) => a + s[1], 0) || 1;
    const subs = ["speculator_prefill", "lookahead", "score_math"].filter((p) => t[p] > 0);
    if (!subs.length || !(t.score > 0)) return null;
    const before = segs.slice(0, segs.findIndex((s) => s[0] === "score")).reduce((a, s) => a + s[1], 0);
    const sub = h("div", { class: "waterfall sub", title: "scoring: speculator prefill, lookahead, score math" });
    const pad = h("div", { class: "seg" }); pad.style.width = `${(100 * before) / total}%`; sub.append(pad);
    for (const p of subs) {
      const seg = h("div", { class: `seg ph-${p}`, title: `${PHASE_LABELS[p]}: ${fmtMs(t[p])}`, dataset: { subphase: p } });
      seg.style.width = `${(100 * t[p]) / total}%`; sub.append(seg);
    }
    return sub;
  }

  function waterfall(job, result) {
    const segs = phaseSegments(job, result);
    const t = result.timings_ms || {};
    const total = segs.reduce((a, s) => a + s[1], 0) || 1;
    const legend = h("div", { class: "legend" }, segs.filter((s) => s[1] > 0).map(([phase, ms, label]) =>
      h("span", {}, h("span", { class: `sw ph-${phase}` }), `${label} `, h("b", {}, fmtMs(ms)), h("span", { class: "muted" }, ` ${fmtPct(ms / total)}`))));
    const subs = ["speculator_prefill", "lookahead", "score_math"].filter((p) => t[p] > 0);
    const subLegend = subs.length ? h("div", { class: "legend muted" }, "scoring: ", subs.map((p) =>
      h("span", {}, h("span", { class: `sw ph-${p}` }), `${PHASE_LABELS[p]} ${fmtMs(t[p])}`))) : null;
    const note = h("div", { class: "ttft-note" }, `queue to last token ${fmtMs(total)} · TTFT ${fmtMs(t.ttft)} after the run started`
      + ` · run ${fmtMs(t.total)}`);
    // a long queue wait squeezes the run's phases to slivers: then the run gets a bar of its own too
    const run = segs.slice(1);
    const zoom = segs[0][1] > 0.5 * total && run.some((s) => s[1] > 0) ? [h("div", { class: "muted" }, "the run alone (without the queue wait):"),
      stackedBar(run, "run-waterfall"), scoreBar(run, t)] : [];
    return h("div", { class: "card" }, h("h2", {}, "Phases"), stackedBar(segs, "waterfall"), scoreBar(segs, t), legend, subLegend,
      note, zoom);
  }

  function draftCard(result) {
    const d = result.draft || {};
    const u = result.usage || {};
    const decodeS = (result.timings_ms || {}).decode / 1000;
    return h("div", { class: "card" }, h("h2", {}, "Draft"), kv([
      ["drafter", d.method || "none"],
      ["drafted / accepted", `${fmtNum(d.drafted)} / ${fmtNum(d.accepted)}`],
      ["accept rate", fmtPct(d.accept_rate)],
      ["mean accepted run", fmtNum(d.mean_accepted_len, 2)],
      ["verify batches", fmtNum(d.verify_batches)],
      ["decode speed", decodeS > 0 ? `${fmtNum(u.completion_tokens / decodeS, 1)} tokens/s` : "–"],
    ]));
  }

  function engineCard(result) {
    const e = result.engine || {}, s = result.spec || {}, u = result.usage || {};
    const show = (v) => (typeof v === "boolean" ? (v ? "yes" : "no") : v === "" || v === null || v === undefined ? "–" : String(v));
    const rows = [
      ["mode", `${show(s.mode)}${s.mode === "specprefill" ? ` (keep ${s.keep}, ${s.scorer}, ${s.windows} window${s.windows === 1 ? "" : "s"}, lookahead ${s.lookahead})` : ""}`],
      ["why", show(s.reason)],
      ["positions", show(s.positions)],
      ["tokens: prompt / kept / generated", `${fmtNum(u.prompt_tokens)} / ${fmtNum(u.kept_tokens)} / ${fmtNum(u.completion_tokens)}`],
      ["finish reason", show(result.finish_reason)],
      ...Object.entries(e).map(([k, v]) => [k.replace(/_/g, " "), show(v)]),
    ];
    const warn = (result.warnings || []).length ? h("div", { class: "notice" }, result.warnings.map((w) => h("div", {}, w))) : null;
    return h("div", { class: "card" }, h("h2", {}, "Engine"), warn, kv(rows));
  }

  function decodeBase64(s) {
    const bin = atob(s || "");
    const out = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
    return out;
  }
  function decodeU32(s) {
    const b = decodeBase64(s);
    const v = new DataView(b.buffer);
    const out = new Array(b.length >> 2);
    for (let i = 0; i < out.length; i++) out[i] = v.getUint32(4 * i, true);
    return out;
  }
  const SHADES = 8;

  /** A function from code-point offsets (how `selection` counts, docs/result.md) to UTF-16 offsets
   *  (how JavaScript strings count); the identity when the text has no character beyond U+FFFF. */
  function utf16Offsets(text) {
    if (!/[\uD800-\uDFFF]/.test(text)) return (i) => i;
    const map = [];
    let u = 0;
    for (const ch of text) { map.push(u); u += ch.length; }
    map.push(u);
    return (i) => map[Math.max(0, Math.min(i, map.length - 1))];
  }

  /** The document with what the target prefilled highlighted (docs/result.md: `selection`). */
  function keptView(doc, sel, result) {
    const text = doc.text || "";
    const at = utf16Offsets(text);
    const span = (s) => [at(s[0]), at(s[1])];
    const offsets = decodeU32(sel.chunk_offsets).map(at);
    const scores = decodeBase64(sel.chunk_scores);
    const kept = (sel.kept_spans || []).filter((s) => Array.isArray(s) && s[1] > s[0]).map(span);
    const prot = (sel.protected_spans || []).filter((s) => Array.isArray(s) && s[1] > s[0]).map(span);
    const cuts = new Set([0, text.length]);
    for (const o of offsets) if (o <= text.length) cuts.add(o);
    for (const [a, b] of kept.concat(prot)) { cuts.add(Math.min(a, text.length)); cuts.add(Math.min(b, text.length)); }
    const points = [...cuts].sort((a, b) => a - b);
    const body = h("div", { dataset: { role: "doctext" } });
    const frag = document.createDocumentFragment();
    const n = offsets.length - 1;
    let ci = -1, ki = 0, pi = 0;
    for (let j = 0; j + 1 < points.length; j++) {
      const a = points[j], b = points[j + 1];
      while (ci + 1 < offsets.length && offsets[ci + 1] <= a) ci++;
      while (ki < kept.length && kept[ki][1] <= a) ki++;
      while (pi < prot.length && prot[pi][1] <= a) pi++;
      const isKept = ki < kept.length && kept[ki][0] <= a;
      const isProt = pi < prot.length && prot[pi][0] <= a;
      const chunk = ci >= 0 && ci < n ? ci : -1;
      const piece = text.slice(a, b);
      if (chunk < 0 && !isKept && !isProt) { frag.append(piece); continue; }
      const score = chunk >= 0 ? scores[chunk] : 0;
      const el = document.createElement("span");
      el.className = isProt ? "p" : isKept ? `k s${Math.min(SHADES - 1, score >> 5)}` : "d";
      if (chunk >= 0) el.dataset.c = chunk;
      el.title = `${isProt ? "protected (always prefilled)" : isKept ? "kept" : "dropped"}${chunk >= 0 ? ` · chunk ${chunk} · score ${score}/255` : ""}`;
      el.textContent = piece;
      frag.append(el);
    }
    body.append(frag);
    const question = h("div", { class: "q", dataset: { role: "question" } },
      h("span", { class: "qlabel" }, "question + chat template: protected, always prefilled"), doc.question || "(no question)");
    const docEl = h("div", { class: "doc", dataset: { role: "document" } }, body, question);
    const map = h("canvas", { class: "minimap", dataset: { role: "minimap" }, title: "minimap: click to jump" });
    const u = result.usage || {};
    const nKeptChunks = new Set([...body.querySelectorAll(".k")].map((e) => e.dataset.c)).size;
    const legend = h("div", { class: "keylegend" },
      h("span", { class: "k" }, "kept"), h("span", { class: "ramp", title: "shade: the chunk's score (low → high)" },
        [...Array(SHADES).keys()].map((i) => h("span", { class: `s${i}` }))),
      h("span", { class: "d" }, "dropped"), h("span", { class: "p" }, "protected"),
      h("span", { class: "muted" }, `${fmtNum(u.kept_tokens)} of ${fmtNum(u.prompt_tokens)} prompt tokens prefilled`
        + ` (${fmtPct(u.prompt_tokens ? u.kept_tokens / u.prompt_tokens : null)}); ${nKeptChunks} of ${n} chunks of ${sel.chunk_tokens} tokens kept`
        + (sel.offsets === "approximate" ? "; offsets approximate (the tokenizer rewrote the text)" : "")));
    const card = h("div", { class: "card", dataset: { role: "kept" } }, h("h2", {}, "What the target saw"), legend,
      h("div", { class: "keptview" }, docEl, map));
    return { card, after: () => drawMinimap(map, docEl) };
  }

  function drawMinimap(canvas, docEl) {
    if (docEl.scrollHeight <= docEl.clientHeight * 1.5) { canvas.hidden = true; return; }
    const dpr = window.devicePixelRatio || 1;
    const W = canvas.clientWidth, H = canvas.clientHeight;
    canvas.width = Math.round(W * dpr); canvas.height = Math.round(H * dpr);
    const ctx = canvas.getContext("2d");
    const full = docEl.scrollHeight;
    const marks = [];
    const shades = ["#fff7cf", "#ffef9f", "#ffe27a", "#ffd35c", "#ffc043", "#ffab36", "#fb9232", "#f47a30"];
    for (const el of docEl.querySelectorAll(".k, .p, .q")) {
      const m = /s(\d)/.exec(el.className);
      marks.push([el.offsetTop / full, Math.max(el.offsetHeight / full, 1 / H),
        el.classList.contains("k") ? shades[m ? Number(m[1]) : 4] : "#8fb0f0"]);
    }
    const paint = () => {
      ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
      ctx.clearRect(0, 0, W, H);
      ctx.fillStyle = "#eef0f4"; ctx.fillRect(8, 0, W - 16, H);
      for (const [y, hgt, color] of marks) { ctx.fillStyle = color; ctx.fillRect(8, y * H, W - 16, Math.max(1, hgt * H)); }
      ctx.strokeStyle = "#2f5bd3"; ctx.lineWidth = 1.5;
      ctx.strokeRect(2, (docEl.scrollTop / full) * H, W - 4, Math.max(4, (docEl.clientHeight / full) * H));
    };
    paint();
    let queued = false;
    docEl.addEventListener("scroll", () => { if (!queued) { queued = true; requestAnimationFrame(() => { queued = false; paint(); }); } });
    const jump = (e) => {
      const y = (e.clientY - canvas.getBoundingClientRect().top) / H;
      docEl.scrollTop = y * full - docEl.clientHeight / 2;
    };
    canvas.addEventListener("mousedown", (e) => { jump(e); const move = (ev) => jump(ev); window.addEventListener("mousemove", move);
      window.addEventListener("mouseup", () => window.removeEventListener("mousemove", move), { once: true }); });
  }

  /** "specprefill — auto: one-off long document: …"; with a prompt-cache hit, how much it held. */
  function ranText(job) {
    const ran = job.ran || {}, result = job.result || {};
    const target = ((result.spec || {}).cache || {}).target;
    const hit = ran.cache_hit && target && typeof target === "object"
      ? ` · prompt cache: ${fmtNum(target.reused_tokens)} of ${fmtNum((result.usage || {}).prompt_tokens)} prompt tokens restored, `
        + `${fmtNum(target.prefilled_tokens)} prefilled` : "";
    return `${ran.mode}${ran.reason ? ` — ${ran.reason}` : ""}${hit}`;
  }

  /** What the target read of the prompt in a run that was not specprefill. */
  function baselineNote(result) {
    const u = result.usage || {};
    const target = ((result.spec || {}).cache || {}).target;
    if (target && typeof target === "object" && target.hit) {
      const from = target.from_slot ? "still in its serving slot" : target.from_other_slot ? "copied from another slot"
        : "restored from the prompt cache";
      return `baseline run: ${fmtNum(target.reused_tokens)} of ${fmtNum(u.prompt_tokens)} prompt tokens were ${from} `
        + `(the same prompt prefix seen before); the target prefilled the other ${fmtNum(target.prefilled_tokens)}`;
    }
    return `baseline run: the target prefilled the whole prompt (${fmtNum(u.prompt_tokens)} tokens)`;
  }

  function jobPage(root, [id]) {
    const title = h("h1", {}, "Job ", h("span", { class: "id" }, id), " ");
    const statusCard = h("div", { class: "card", dataset: { role: "status" } });
    const answerPre = h("pre", { class: "answer", dataset: { role: "answer" } });
    const live_ = h("div", { class: "card" }, h("h2", {}, "Answer"), answerPre);
    const rest = h("div");
    root.replaceChildren(title, statusCard, rest);
    let resultShown = false, stopped = false;

    const cancel = async (btn) => {
      btn.disabled = true;
      try {
        await api(`/v1/jobs/${enc(id)}`, { method: "DELETE" });  // a same-origin request with Origin: the guard lets it through
        showStatus(await api(`/v1/jobs/${enc(id)}`));
      } catch (e) { btn.disabled = false; alert(e.message); }
    };
    const showStatus = (job) => {
      title.replaceChildren("Job ", h("span", { class: "id" }, job.id), " ", badge(job.status));
      const inp = job.input || {};
      const cancellable = !JOB_TERMINAL.has(job.status) && !job.cancel_requested;
      statusCard.replaceChildren(kv([
        ["status", [badge(job.status), " ", job.status === "running" ? progressCell(job) : "",
          job.cancel_requested && !JOB_TERMINAL.has(job.status) ? h("span", { class: "prog" }, "cancel requested") : "",
          cancellable ? h("button", { type: "button", dataset: { role: "cancel" }, onclick: (e) => cancel(e.currentTarget) }, "Cancel") : ""]],
        ["file", inp.filename ? inp.filename : "–"],
        ["size", inp.size_bytes ? `${fmtNum(inp.size_bytes)} bytes` : "–"],
        ["question", inp.question || "–"],
        job.ran ? ["ran", h("span", { dataset: { role: "ran" } }, ranText(job))] : null,
        job.batch_id ? ["batch", [navLink(batchHref(job.batch_id), job.batch_id), job.custom_id ? ` · ${job.custom_id}` : ""]] : null,
        ["created", timeEl(job.created_at)],
        ["started / finished", [timeEl(job.started_at), " / ", timeEl(job.finished_at)]],
        ["queue wait", fmtMs(job.queue_wait_ms)],
        ["worker", job.worker || "–"],
        ["attempts", `${job.attempts} of ${job.max_attempts}`],
        job.error ? ["error", h("span", { class: "err" }, job.error)] : null,
        job.params && Object.keys(job.params).length ? ["params", h("span", { class: "mono" }, JSON.stringify(job.params))] : null,
      ]));
    };

    const showResult = async (job) => {
      resultShown = true;
      const result = job.result;
      if (!result) {
        rest.replaceChildren(h("div", { class: "muted" }, job.status === "succeeded" ? "no stored result" : ""));
        ready("job");
        return;
      }
      answerPre.textContent = result.text || "";
      rest.replaceChildren(waterfall(job, result), h("div", { class: "grid" }, live_, draftCard(result), engineCard(result)));
      const sel = result.selection;
      if (sel && sel.chunk_offsets !== undefined) {
        try {
          const doc = await api(`/v1/jobs/${enc(job.id)}/document`);
          if (stopped) return;
          const view = keptView(doc, sel, result);
          rest.append(view.card);
          view.after();
        } catch (e) {
          rest.append(h("div", { class: "card muted" }, `the document is not available: ${e.message}`));
        }
      } else {
        rest.append(h("div", { class: "card muted", dataset: { role: "kept" } },
          (result.spec || {}).mode === "specprefill" ? "this result has no stored selection (older run)" : baselineNote(result)));
      }
      ready("job");
    };

    const stop = live.watchJob(id, {
      onJob: (job) => {
        showStatus(job);
        if (JOB_TERMINAL.has(job.status)) { if (!resultShown) showResult(job); }
        else {
          if (!rest.contains(live_)) rest.replaceChildren(live_);
          if (document.documentElement.dataset.ready !== "job") ready("job");
        }
      },
      onText: (text) => { answerPre.textContent = text; },
      onMissing: () => { root.replaceChildren(title, h("div", { class: "card notfound", dataset: { role: "error" } }, `not found: no job ${id}`)); ready("job"); },
    });
    return () => { stopped = true; stop(); };
  }

  // --- batches -----------------------------------------------------------------------------------------------
  function countsCell(c) {
    c = c || {};
    const t = c.total || 0;
    const ok = h("span", { class: "ok" }), bad = h("span", { class: "bad" });
    ok.style.width = `${t ? (100 * (c.completed || 0)) / t : 0}%`;
    bad.style.width = `${t ? (100 * (c.failed || 0)) / t : 0}%`;
    return [h("span", { class: "bar split" }, ok, bad), h("span", { class: "prog" }, `${c.completed || 0} ok · ${c.failed || 0} failed · ${t}`)];
  }
  function batchName(b) { return (b.metadata && b.metadata.name) || b.input_filename || ""; }

  function batchesPage(root, _args, query) {
    const state = { status: query.get("status") || "", name: query.get("name") || "", offset: Number(query.get("offset")) || 0, limit: 50 };
    const status = h("select", { name: "status" }, h("option", { value: "" }, "all"), BATCH_STATUSES.map((s) => h("option", { value: s }, s.replace("_", " "))));
    status.value = state.status;
    const name = h("input", { type: "text", name: "name", placeholder: "name" });
    name.value = state.name;
    const [prevBtn, nextBtn] = pager();
    const table = liveTable(["batch", "name", "status", "requests", "created", "finished"], (b) => [
      h("td", { class: "mono" }, navLink(batchHref(b.id), b.id)),
      h("td", { class: "wrap" }, batchName(b)),
      h("td", {}, badge(b.status)),
      h("td", {}, countsCell(b.request_counts)),
      h("td", {}, timeEl(b.created_at)),
      h("td", {}, timeEl(b.completed_at || b.failed_at || b.cancelled_at || b.expired_at)),
    ]);
    const empty = h("div", { class: "muted" });
    root.replaceChildren(h("h1", {}, "Batches"),
      h("div", { class: "filters" }, h("label", {}, "status ", status), h("label", {}, "name ", name)),
      table.table, empty, h("div", { class: "pager" }, prevBtn, nextBtn));
    const list = pagedList({ name: "batches", endpoint: "/v1/batches", state, keys: ["status", "name"], table, prevBtn, nextBtn,
      onList: (page) => {
        empty.textContent = page.data.length ? "" : "no batches";
        nextBtn.disabled = page.data.length < state.limit;
      } });
    list.filter(status, "status");
    list.filter(name, "name");
    list.restart();
    return list.stop;
  }

  function phaseTable(phases) {
    const names = Object.keys(phases || {}).sort((a, b) => {
      const ia = PHASE_ORDER.indexOf(a), ib = PHASE_ORDER.indexOf(b);
      return (ia < 0 ? 99 : ia) - (ib < 0 ? 99 : ib) || a.localeCompare(b);
    });
    return h("table", { class: "list", dataset: { role: "phase-stats" } },
      h("thead", {}, h("tr", {}, ["phase", "p50", "p95", "mean", "min", "max", "n"].map((t, i) => h("th", { class: i ? "num" : null }, t)))),
      h("tbody", {}, names.map((p) => {
        const s = phases[p];
        return h("tr", { dataset: { phase: p } }, h("td", {}, PHASE_LABELS[p] || p),
          [s.p50, s.p95, s.mean, s.min, s.max].map((v) => h("td", { class: "num", dataset: { ms: String(v) } }, fmtMs(v))),
          h("td", { class: "num" }, fmtNum(s.count)));
      })));
  }

  /** p-th percentile (0..1) of sorted numbers, linear between ranks (as PostgreSQL's percentile_cont). */
  function percentile(sorted, p) {
    if (!sorted.length) return null;
    const x = p * (sorted.length - 1), lo = Math.floor(x), hi = Math.ceil(x);
    return sorted[lo] + (sorted[hi] - sorted[lo]) * (x - lo);
  }
  function queueWaits(jobs) {
    const w = jobs.map((j) => j.queue_wait_ms).filter((x) => typeof x === "number").sort((a, b) => a - b);
    return w.length ? `${fmtMs(percentile(w, 0.5))} / ${fmtMs(percentile(w, 0.95))} (${w.length} started)` : "–";
  }

  function batchPage(root, [id]) {
    const head = h("div"), statsEl = h("div"), jobsEl = h("div");
    root.replaceChildren(h("h1", {}, "Batch ", h("span", { class: "id" }, id)), head, statsEl, jobsEl);
    const jobs = liveTable(JOB_HEADERS, jobRow, [7], JOB_TABLE);
    jobsEl.replaceChildren(h("div", { class: "card" }, h("h2", {}, "Requests"), jobs.table));
    let first = true;
    const stop = live.every(2000, async () => {
      let batch;
      try { batch = await api(`/v1/batches/${enc(id)}`); } catch (e) {
        if (e.status === 404) { root.replaceChildren(h("h1", {}, "Batch ", h("span", { class: "id" }, id)), failure(e)); ready("batch"); return false; }
        throw e;
      }
      const [stats, list] = await Promise.all([api(`/v1/batches/${enc(id)}/stats`), api(`/v1/jobs?batch_id=${enc(id)}&limit=200`)]);
      const c = batch.request_counts || {};
      const base = `/v1/batches/${enc(id)}`;
      head.replaceChildren(h("div", { class: "grid" },
        h("div", { class: "card", dataset: { role: "batch" } }, h("h2", {}, batchName(batch) || "Batch"), kv([
          ["status", badge(batch.status)],
          ["requests", countsCell(c)],
          ["created", timeEl(batch.created_at)],
          ["started", timeEl(batch.in_progress_at)],
          ["finished", timeEl(batch.completed_at || batch.failed_at || batch.cancelled_at || batch.expired_at)],
          ["input", batch.input_filename || "–"],
          ["results", [downloadLink(`${base}/results`, `${id}.jsonl`, "JSONL"), " · ", downloadLink(`${base}/results?format=csv`, `${id}.csv`, "CSV"),
            " · ", downloadLink(`${base}/errors`, `${id}-errors.jsonl`, "errors (JSONL)")]],
        ])),
        h("div", { class: "card", dataset: { role: "throughput" } }, h("h2", {}, "Throughput"), kv([
          ["succeeded", fmtNum(stats.count)],
          ["wall time", stats.wall_s === null ? "–" : fmtMs(stats.wall_s * 1000)],
          ["throughput", stats.jobs_per_s ? `${fmtNum(stats.jobs_per_s * 60, 1)} jobs/min` : "–"],
          ["mean prompt tokens", fmtNum(stats.prompt_tokens_mean)],
          ["mean kept ratio", fmtPct(stats.kept_ratio_mean)],
          ["mean generated tokens", fmtNum(stats.completion_tokens_mean, 1)],
          ["queue wait p50 / p95", queueWaits(list.data)],
        ]))));
      statsEl.replaceChildren(h("div", { class: "card" }, h("h2", {}, "Per phase (succeeded requests)"), phaseTable(stats.phases)));
      jobs.update(list.data);
      if (first) { first = false; ready("batch"); }
      return !BATCH_TERMINAL.has(batch.status);
    });
    return stop;
  }

  // --- workers -----------------------------------------------------------------------------------------------
  function workersPage(root) {
    const table = liveTable(["worker", "state", "device", "backend", "model", "slots busy", "current jobs", "jobs done", "heartbeat"], (w) => {
      const slots = Number(w.slots) || 1, busy = Number(w.busy) || 0;
      return [
        h("td", { class: "mono" }, w.name),
        h("td", {}, w.heartbeat_age_s > STALE_S ? badge("stale") : w.ready === false ? badge("warming") : badge("ready")),
        h("td", {}, w.device || "–"),
        h("td", {}, w.backend || "–"),
        h("td", { class: "wrap" }, w.model || "–"),
        h("td", {}, bar(busy / slots), h("span", { class: "prog" }, `${busy} / ${slots}`)),
        h("td", { class: "mono wrap" }, (Array.isArray(w.current_jobs) ? w.current_jobs : []).map((j, i) => [i ? " " : "", navLink(jobHref(j), j)])),
        h("td", { class: "num" }, fmtNum(w.jobs_done)),
        h("td", { class: "num" }, typeof w.heartbeat_age_s === "number" ? `${w.heartbeat_age_s.toFixed(1)} s ago` : "–"),
      ];
    });
    const empty = h("div", { class: "muted" });
    root.replaceChildren(h("h1", {}, "Workers"), table.table, empty);
    let first = true;
    return live.every(POLL_WORKERS_MS, async () => {
      let list;
      try { list = await api("/v1/workers"); } catch (e) { empty.textContent = e.message; if (first) { first = false; ready("workers"); } return; }
      const rows = (list.data || []).map((w) => ({ ...w, id: w.name, heartbeat_age_s: Math.round((w.heartbeat_age_s || 0) * 10) / 10 }));
      table.update(rows);
      empty.textContent = rows.length ? "" : "no live workers (start one with `specq worker`)";
      if (first) { first = false; ready("workers"); }
    });
  }


  // --- evidence (GET /v1/evidence: where mode auto may run specprefill, docs/quality.md "Evidence rows") --------
  function evidencePage(root) {
    const keyText = (k) => `${k.target || k.target_sha256.slice(0, 12)} + ${k.speculator || k.speculator_sha256.slice(0, 12)}; `
      + `${k.backend}, ${k.prompt_shape}${k.task ? `, task ${k.task}` : ""}, positions ${k.positions}, ${k.score_math}; `
      + `scorer ${k.scorer}${k.window ? ` ${k.window}` : " (one pass)"}, ${k.chunk_rule} rule, keep ${k.keep}, max_keep ${k.max_keep}, `
      + `chunk ${k.chunk}, lookahead ${k.lookahead}, pool ${k.pool}, ${k.selection}${k.pipelined ? ", pipelined" : ""}`
      + `${k.protect_tail >= 0 ? `, protect_tail ${k.protect_tail}` : ""}`;
    const tbody = h("tbody");
    const table = h("table", { class: "list evidence" },
      h("thead", {}, h("tr", {}, ["origin", "arm", "metric", "length", "documents", "n", "value", "bound", "passes", "in-sample", "shadow checks", "agreement", "key", "source"]
        .map((t) => h("th", {}, t)))), tbody);
    const note = h("p", { class: "muted" });
    // calibrations run by the service's workers (GET /v1/calibrations, admin only: docs/quality.md "Calibrate
    // through the service"), refreshed while the page is open
    const calBody = h("tbody");
    const calNote = h("p", { class: "muted" });
    const calTable = h("table", { class: "list calibrations" },
      h("thead", {}, h("tr", {}, ["calibration", "status", "progress", "keep", "lengths", "rows written", "created", "error"]
        .map((t) => h("th", {}, t)))), calBody);
    root.replaceChildren(h("h1", {}, "Quality evidence"), note, table,
      h("h2", {}, "Calibrations"), calNote, calTable);
    let stopped = false;
    let calTimer = null;
    const calibrations = async () => {
      let list;
      try { list = await api("/v1/calibrations"); } catch (e) {
        if (!stopped) calNote.textContent = e.status === 403 ? "Calibrations are an admin key's (specq keys create --admin)." : e.message;
        return;
      }
      if (stopped) return;
      const cals = Array.isArray(list.data) ? list.data : [];
      calNote.textContent = cals.length ? "" : "No calibration yet: `specq calibrate --documents qs.jsonl --service` runs one on this deployment's workers.";
      calBody.replaceChildren(...cals.map((c) => {
        const p = c.progress || {};
        const rows = Object.values(c.rows_written || {}).reduce((n, ids) => n + ids.length, 0);
        return h("tr", { dataset: { calibration: c.id, status: c.status } },
          h("td", { class: "mono" }, c.id),
          h("td", {}, badge(c.status)),
          h("td", { class: "num cal-progress" }, `${fmtNum(p.done)} / ${fmtNum(p.total)}` + (p.skipped ? ` (${fmtNum(p.skipped)} skipped)` : "")),
          h("td", {}, ((c.settings || {}).keep || []).join(", ")),
          h("td", {}, ((c.settings || {}).lengths || []).join(", ")),
          h("td", { class: "num cal-rows" }, fmtNum(rows)),
          h("td", {}, (c.created_at || "").replace("T", " ").slice(0, 19)),
          h("td", { class: "evwhy" }, c.error || ""));
      }));
    };
    (async () => {
      await calibrations();
      const tick = async () => { if (stopped) return; await calibrations(); if (!stopped) calTimer = setTimeout(tick, 3000); };
      if (!stopped) calTimer = setTimeout(tick, 3000);
    })();
    (async () => {
      let list;
      try { list = await api("/v1/evidence"); } catch (e) { if (!stopped) { note.textContent = e.message; ready("evidence"); } return; }
      if (stopped) return;
      const rows = Array.isArray(list.data) ? list.data : [];
      const passing = rows.filter((r) => r.passes && r.in_use).length;
      note.textContent = passing
        ? `${passing} passing row(s): mode auto runs specprefill only for jobs whose settings equal one of them, inside its lengths.`
        : "No row passes (a pass needs 8 documents, 40 out-of-sample questions and a clustered lower bound of 0.95): "
          + "mode auto runs baseline everywhere unless the operator sets SPECQ_AUTO_QUALITY_MIN_TOKENS.";
      tbody.replaceChildren(...rows.map((r) => h("tr", { class: r.in_use ? null : "muted", dataset: { passes: r.passes ? "1" : "0" } },
        h("td", {}, r.origin + (r.in_use ? "" : " (superseded)")),
        h("td", {}, r.arm),
        h("td", {}, r.metric || "answer_right"),
        h("td", { class: "num" }, fmtNum(r.length)),
        h("td", { class: "num" }, fmtNum(Object.keys(r.documents || {}).length)),
        h("td", { class: "num" }, fmtNum(r.n)),
        h("td", { class: "num", title: r.metric === "answer_right" ? "arm right / baseline right" : `mean ${r.metric} per question` },
          typeof r.value === "number" ? r.value.toFixed(3) : typeof r.ratio === "number" ? r.ratio.toFixed(3) : "–"),
        h("td", { class: "num", title: r.bound_method }, typeof r.bound === "number" ? r.bound.toFixed(3) : "–"),
        h("td", { class: "evwhy" }, r.passes ? badge("passes") : r.fails),
        // in-sample, or certified: the keep `specq calibrate` chose on the other half of the band's documents
        h("td", {}, r.in_sample ? h("span", { title: r.in_sample_why }, "yes")
          : r.certified ? h("span", { title: "no: measures the keep chosen on the other half of its band's documents (specq calibrate)" }, "certified") : ""),
        // shadow checks (SPECQ_SHADOW_RATE, engine/policy/shadow.py): answered (cancelled), agreement >= its 90% lower bound
        h("td", { class: "num shadow-n" }, r.shadow && (r.shadow.n || r.shadow.cancelled)
          ? fmtNum(r.shadow.n) + (r.shadow.cancelled ? ` (${fmtNum(r.shadow.cancelled)} cancelled)` : "") : "–"),
        h("td", { class: "num shadow-agreement", title: r.shadow && r.shadow.disables ? r.disabled : "" },
          r.shadow && r.shadow.n ? `${r.shadow.agreement.toFixed(2)} (≥ ${r.shadow.bound.toFixed(2)})` : "–"),
        h("td", { class: "mono evkey" }, r.key ? keyText(r.key) : ""),
        h("td", { class: "evsrc" }, r.source))));
      ready("evidence");
    })();
    return () => { stopped = true; clearTimeout(calTimer); };
  }

  route();
})();
