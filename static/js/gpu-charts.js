/* Live GPU charts: uPlot instances created once, fed by htmx (pushed, or polled: hx-swap="none").
 *
 * An element with [data-gpu-charts] polls a JSON endpoint; each answer is
 *   {range, charts: [{key, title, unit, x: [epoch s], series: [label], values: [[v|null]]}]}
 * The first answer creates one uPlot per chart; later answers only call setData, so the
 * canvas is never rebuilt (it is rebuilt only if the set of series changes, e.g. a new GPU).
 * [data-cluster] elements get the cluster overview: charts plus the heatmap and tables.
 */
(function () {
  "use strict";

  var PALETTE = ["#3b5bdb", "#2b8a3e", "#e67700", "#c92a2a", "#7048e8", "#0c8599",
                 "#d6336c", "#5c940d", "#1971c2", "#e8590c", "#862e9c", "#087f5b"];
  var state = new WeakMap(); // container element -> {key -> {plot, sig}}

  function color(i) { return PALETTE[i % PALETTE.length]; }

  function fmt(unit) {
    return function (u, v) { return v == null ? "–" : (Math.round(v * 10) / 10) + " " + unit; };
  }

  // A chart fills its holder: one cell of the grid (the grid decides how many fit a row).
  function width(holder) {
    return Math.max(240, Math.floor((holder.clientWidth || 600) - 8));
  }

  function makePlot(chart, holder) {
    var series = [{}];
    chart.series.forEach(function (label, i) {
      series.push({ label: label, stroke: color(i), width: 1.5, spanGaps: true, value: fmt(chart.unit) });
    });
    var opts = {
      title: chart.title + " (" + chart.unit + ")",
      width: width(holder),
      height: 200,
      series: series,
      scales: {
        // one sample alone would stretch the axis over years: show the minutes around it
        x: { time: true, range: function (u, min, max) { return min === max ? [min - 300, max + 60] : [min, max]; } },
        y: chart.unit === "%" ? { range: [0, 100] } : {},
      },
      axes: [{}, { size: 60 }],
      legend: { live: true },
    };
    return new uPlot(opts, [chart.x].concat(chart.values), holder);
  }

  // Holders first, plots after: a grid cell's width is known only once all its siblings are
  // in (one lone cell spans the whole row). Each holder is watched, so a plot follows its cell
  // whenever the grid lays out again (window resize, a scrollbar, a sibling appearing).
  var resizer = window.ResizeObserver ? new ResizeObserver(function (entries) {
    entries.forEach(function (entry) {
      var plot = entry.target._plot;
      if (plot && Math.abs(plot.width - width(entry.target)) > 1) {
        plot.setSize({ width: width(entry.target), height: 200 });
      }
    });
  }) : null;

  function renderCharts(el, charts) {
    var plots = state.get(el);
    if (!plots) { plots = {}; state.set(el, plots); }
    var pending = [];
    charts.forEach(function (chart) {
      var entry = plots[chart.key];
      var empty = chart.x.length === 0;
      if (!entry) {
        var holder = document.createElement("div");
        holder.className = "mon-chart";
        holder.setAttribute("data-chart-key", chart.key);
        el.appendChild(holder);
        entry = plots[chart.key] = { plot: null, sig: null, holder: holder };
        if (resizer) { resizer.observe(holder); }
      }
      // no samples: no plot (uPlot would draw an empty axis from 1970), the status says why
      entry.holder.hidden = empty;
      if (!empty) { pending.push([chart, entry]); }
    });
    pending.forEach(function (item) {
      var chart = item[0], entry = item[1];
      var sig = chart.series.join("\u0001");
      if (entry.plot && entry.sig === sig) {
        entry.plot.setData([chart.x].concat(chart.values)); // same canvas, new data
        return;
      }
      if (entry.plot) { entry.plot.destroy(); }
      entry.plot = makePlot(chart, entry.holder);
      entry.holder._plot = entry.plot;
      entry.sig = sig;
    });
    var status = el.parentElement && el.parentElement.querySelector("[data-chart-status]");
    if (status) {
      status.textContent = pending.length ? "" :
        (Object.keys(plots).some(function (k) { return plots[k].plot; })
          ? "No telemetry in this range yet." : "No telemetry yet.");
    }
  }

  // ---- cluster overview: heatmap on one canvas, repainted in place
  function heatColor(util, held, health) {
    if (health === "unhealthy") { return "#c92a2a"; }
    if (util == null) { return "#ced4da"; }
    var t = Math.max(0, Math.min(1, util / 100));
    var l = Math.round(92 - t * 52);
    return held ? "hsl(228, 70%, " + l + "%)" : "hsl(145, 45%, " + l + "%)";
  }

  // `hm`: parallel arrays, one entry per GPU in node order; hm.nodes[i] = [id, name, state, n].
  function drawHeatmap(canvas, hm) {
    var cell = 12, gap = 2, perRow = 0;
    hm.nodes.forEach(function (n) { perRow = Math.max(perRow, n[3]); });
    var nodeW = perRow * (cell + gap) + 6;
    var cols = Math.max(1, Math.floor((canvas.parentElement.clientWidth || 800) / nodeW));
    var rows = Math.ceil(hm.nodes.length / cols);
    var w = cols * nodeW, h = Math.max(cell, rows * (cell + 6));
    if (canvas.width !== w || canvas.height !== h) { canvas.width = w; canvas.height = h; }
    var ctx = canvas.getContext("2d");
    ctx.clearRect(0, 0, w, h);
    var hits = [], k = 0;
    hm.nodes.forEach(function (n, i) {
      var x0 = (i % cols) * nodeW, y0 = Math.floor(i / cols) * (cell + 6);
      for (var j = 0; j < n[3]; j++, k++) {
        var x = x0 + j * (cell + gap), util = hm.util[k], used = hm.used_milli[k];
        ctx.fillStyle = heatColor(util, used > 0, hm.healths[hm.health[k]]);
        ctx.fillRect(x, y0, cell, cell);
        if (used > 0) { ctx.strokeStyle = "#111827"; ctx.strokeRect(x + 0.5, y0 + 0.5, cell - 1, cell - 1); }
        hits.push([x, y0, k, n]);
      }
    });
    canvas._hits = hits;
    canvas._hm = hm;
    canvas._cell = cell;
  }

  function heatmapLabel(hm, k, n) {
    var util = hm.util[k], used = hm.used_milli[k];
    return n[1] + "/gpu" + hm.index[k] + " · " + hm.models[hm.model[k]] + " · " +
      (util == null ? "no telemetry" : Math.round(util) + "% util") + " · " +
      (used > 0 ? "held " + used + "m of " + hm.capacity_milli[k] + "m" : "idle") + " · node " + n[2];
  }

  function heatmapTooltip(canvas) {
    if (canvas._tooltip) { return; }
    canvas._tooltip = true;
    canvas.addEventListener("mousemove", function (e) {
      var r = canvas.getBoundingClientRect(), x = e.clientX - r.left, y = e.clientY - r.top;
      var found = (canvas._hits || []).find(function (h) {
        return x >= h[0] && x < h[0] + canvas._cell && y >= h[1] && y < h[1] + canvas._cell;
      });
      canvas.title = found ? heatmapLabel(canvas._hm, found[2], found[3]) : "";
    });
  }

  function fillTable(tbody, rows, cells) {
    while (tbody.firstChild) { tbody.removeChild(tbody.firstChild); }
    rows.forEach(function (row) {
      var tr = document.createElement("tr");
      cells(row).forEach(function (v, i) {
        var td = document.createElement("td");
        td.textContent = v;
        if (i > 0) { td.className = "num"; }
        tr.appendChild(td);
      });
      tbody.appendChild(tr);
    });
  }

  function renderCluster(root, data) {
    var charts = root.querySelector("[data-gpu-charts-target]");
    if (charts) { renderCharts(charts, data.charts); }
    var canvas = root.querySelector("canvas[data-gpu-heatmap]");
    if (canvas) { drawHeatmap(canvas, data.heatmap); heatmapTooltip(canvas); }
    var models = root.querySelector("[data-models] tbody");
    if (models) {
      fillTable(models, data.models, function (m) {
        return [m.model, m.total, m.free, m.allocated_pct + " %", m.largest_gang +
          (m.largest_gang ? " (" + m.gang_shape[0] + " × " + m.gang_shape[1] + ")" : ""),
          m.largest_node_block, m.queued_jobs, m.queued_gpus];
      });
    }
    var frag = root.querySelector("[data-frag]");
    if (frag) { frag.textContent = data.fragmentation ? data.fragmentation.ratio + " %" : "–"; }
    var anyq = root.querySelector("[data-queue-any]");
    if (anyq) { anyq.textContent = data.queue_any.jobs + " job(s), " + data.queue_any.gpus + " GPU(s)"; }
    var stamp = document.querySelector("[data-updated]"); // in the page head, outside root
    if (stamp) { stamp.textContent = new Date(data.generated_at * 1000).toLocaleTimeString(); }
  }

  document.addEventListener("htmx:afterRequest", function (e) {
    var el = e.detail.elt;
    if (!el || !el.matches("[data-gpu-charts], [data-cluster]")) { return; }
    var status = el.parentElement && el.parentElement.querySelector("[data-chart-status]");
    if (!e.detail.successful) {
      if (status) {
        var msg = "Could not load telemetry";
        try { msg = JSON.parse(e.detail.xhr.responseText).detail || msg; } catch (err) { /* keep */ }
        status.textContent = msg;
      }
      return;
    }
    var data;
    try { data = JSON.parse(e.detail.xhr.responseText); } catch (err) { return; }
    if (el.matches("[data-cluster]")) { renderCluster(el, data); } else { renderCharts(el, data.charts); }
  });

  document.addEventListener("change", function (e) {
    var select = e.target;
    if (!select.matches || !select.matches("[data-chart-range]")) { return; }
    var target = document.getElementById(select.getAttribute("data-chart-range"));
    if (target && window.htmx) { window.htmx.trigger(target, "chart-refresh"); }
  });

  window.addEventListener("resize", function () { // without ResizeObserver only
    if (resizer) { return; }
    document.querySelectorAll("[data-gpu-charts], [data-gpu-charts-target]").forEach(function (el) {
      var plots = state.get(el);
      if (!plots) { return; }
      Object.keys(plots).forEach(function (k) {
        if (plots[k].plot) { plots[k].plot.setSize({ width: width(plots[k].holder), height: 200 }); }
      });
    });
  });
})();
