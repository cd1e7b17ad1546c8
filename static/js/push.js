/* Pushed page updates: one EventSource per page (web/events.py), instead of a poll per part.
 *
 * A part that can be pushed declares what it listens to:
 *   data-push="job|logs|telemetry|queue"   the event that refreshes it
 *   data-push-topic="job=42"               what the stream must carry (job=, node=, cluster=, queue=)
 * and keeps its htmx request, triggered by "push" plus a guarded poll:
 *   hx-trigger="push, every 2s [!gpPushLive()]"
 * so it polls only while push is unavailable: no EventSource in the browser, the server said
 * 204 (no Redis, or a WSGI server that cannot stream), the stream failed, or it has been
 * reconnecting for longer than GRACE_MS. On "ready" (every (re)connection) each part refreshes
 * once, covering what changed between the page's rendering and the subscription.
 */
(function () {
  "use strict";

  var GRACE_MS = 8000;
  var state = "off"; // off | connecting | open | failed
  var since = Date.now();
  var lastLog = 0; // the newest log chunk id the stream announced

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

  function logsBehind(el) {
    return Number(el.getAttribute("data-push-after") || 0) < lastLog;
  }

  function topics() {
    var seen = [];
    document.querySelectorAll("[data-push-topic]").forEach(function (el) {
      var t = el.getAttribute("data-push-topic");
      if (seen.indexOf(t) < 0) { seen.push(t); }
    });
    return seen;
  }

  // Which event caused a request, for the benchmark and the browser tests (push or other).
  document.addEventListener("htmx:configRequest", function (e) {
    var t = e.detail.triggeringEvent;
    e.detail.headers["X-Refresh-Cause"] = t && t.type === "push" ? "push" : "other";
  });

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
      try { lastLog = Math.max(lastLog, JSON.parse(e.data).last || 0); } catch (err) { /* keep */ }
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
