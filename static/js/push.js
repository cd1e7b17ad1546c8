/* Pushed page updates: one EventSource per page (web/events.py), instead of a poll per part.
 *
 * A part that can be pushed declares what it listens to and how often it would poll:
 *   data-push="job|logs|telemetry|queue"   the event that refreshes it
 *   data-push-topic="job=42"               what the stream must carry (job=, array=, node=, cluster=, queue=)
 *   data-poll="2000"                       its poll interval in ms, used only without push
 * and triggers its htmx request on "push" and "poll":  hx-trigger="push, poll".
 * This file fires "poll" only while push is unavailable: no EventSource in the browser, the
 * server said 204 (no Redis, or a WSGI server that cannot stream), the stream failed, or it has
 * been reconnecting for longer than GRACE_MS. (Not htmx's `every 2s [filter]`: its filters are
 * compiled with eval, which the content security policy forbids.) On "ready" (every
 * (re)connection) each part refreshes once, covering what changed between the page's rendering
 * and the subscription. A part whose answer is 286 (htmx's "stop polling") polls no more.
 */
(function () {
  "use strict";

  var GRACE_MS = 8000;
  var state = "off"; // off | connecting | open | failed
  var since = Date.now();
  var lastLog = {}; // job id -> the newest log chunk id the stream announced for it
  var skipped = 0; // polls not made because push was live (the browser tests wait on it)

  window.gpPushLive = function () {
    if (state === "open") { return true; }
    return state === "connecting" && Date.now() - since < GRACE_MS;
  };

  function setState(s) {
    state = s;
    since = Date.now();
    document.documentElement.setAttribute("data-push", s);
  }

  function fire(el) {
    if (window.htmx && document.body.contains(el)) { window.htmx.trigger(el, "push"); }
  }

  function parts(event) {
    return document.querySelectorAll('[data-push~="' + event + '"]');
  }

  // A log tail names its job in its topic ("job=42"); an array's page shows any shard's.
  function logsBehind(el) {
    var job = (el.getAttribute("data-push-topic") || "").split("=")[1] || "";
    return Number(el.getAttribute("data-push-after") || 0) < (lastLog[job] || 0);
  }

  function topics() {
    var seen = [];
    document.querySelectorAll("[data-push-topic]").forEach(function (el) {
      var t = el.getAttribute("data-push-topic");
      if (seen.indexOf(t) < 0) { seen.push(t); }
    });
    return seen;
  }

  window.gpPushStats = function () { return { state: state, skipped: skipped }; };

  // Which event caused a request, for the benchmark and the browser tests (push, poll, other).
  document.addEventListener("htmx:configRequest", function (e) {
    var t = e.detail.triggeringEvent && e.detail.triggeringEvent.type;
    e.detail.headers["X-Refresh-Cause"] = t === "push" || t === "poll" ? t : "other";
  });

  document.addEventListener("htmx:afterRequest", function (e) {
    if (e.detail.xhr && e.detail.xhr.status === 286 && e.detail.elt) { e.detail.elt._gpStopped = true; }
  });

  // The fallback: each [data-poll] part polls at its interval while push is not live.
  setInterval(function () {
    var now = Date.now();
    document.querySelectorAll("[data-poll]").forEach(function (el) {
      var every = Number(el.getAttribute("data-poll")) || 2000;
      if (!el._gpNext) { el._gpNext = now + every; return; }
      if (now < el._gpNext || el._gpStopped) { return; }
      el._gpNext = now + every;
      if (window.gpPushLive()) { skipped += 1; } else if (window.htmx) { window.htmx.trigger(el, "poll"); }
    });
  }, 250);

  // A log tail answers with a new span: if the stream announced later lines meanwhile, fetch.
  document.addEventListener("htmx:load", function (e) {
    var el = e.detail.elt;
    if (el && el.matches && el.matches('[data-push~="logs"]') && logsBehind(el)) { fire(el); }
  });

  function start() {
    var wanted = topics();
    if (!wanted.length) { return; }
    if (!window.EventSource) { setState("failed"); return; }
    setState("connecting");
    var source = new EventSource("/events/?" + wanted.join("&"));
    source.addEventListener("ready", function () {
      setState("open");
      document.querySelectorAll("[data-push]").forEach(fire);
    });
    ["job", "queue", "telemetry"].forEach(function (name) {
      source.addEventListener(name, function () { parts(name).forEach(fire); });
    });
    source.addEventListener("logs", function (e) {
      try {
        var d = JSON.parse(e.data), job = String(d.job);
        lastLog[job] = Math.max(lastLog[job] || 0, d.last || 0);
      } catch (err) { /* keep */ }
      parts("logs").forEach(function (el) { if (logsBehind(el)) { fire(el); } });
    });
    source.onerror = function () {
      if (source.readyState === EventSource.CLOSED) {
        setState("failed"); // 204, 4xx, 5xx: the page polls from now on
      } else if (state === "open") {
        setState("connecting"); // the browser retries; polls resume after GRACE_MS
      }
    };
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();
