/* attnscope local viewer: example list and search, per-head statistics, head-clustering
 * scatter; the views themselves are AttnScope.mount (attnscope.js). Talks only to the server
 * it came from. Every text goes in with textContent. */
(function () {
  "use strict";
  var info = JSON.parse(document.getElementById("viewer-info").textContent);
  // the model's own layer numbers (a hybrid's attention layers: the store's record of them)
  function layerName(l) { return AttnScope.layerName(info.summary && info.summary.layer_numbers, l); }
  var $ = function (id) { return document.getElementById(id); };
  var current = { pos: null, viewer: null, listNext: null, query: "" };

  function getJSON(url) {
    return fetch(url).then(function (r) {
      return r.json().catch(function () { throw new Error("bad response from the viewer (HTTP " + r.status + ")"); })
        .then(function (d) {
          if (!r.ok || (d && d.error)) throw new Error(d && d.error ? d.error : "HTTP " + r.status);
          return d;
        });
    });
  }

  function showError(msg) {
    var e = $("vw-error");
    e.textContent = msg;
    e.hidden = !msg;
  }

  function node(tag, attrs, parent, text) {
    var e = document.createElement(tag);
    if (attrs) for (var k in attrs) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    if (parent) parent.appendChild(e);
    return e;
  }

  function svgNode(tag, attrs, parent, text) {
    var e = document.createElementNS("http://www.w3.org/2000/svg", tag);
    if (attrs) for (var k in attrs) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    if (parent) parent.appendChild(e);
    return e;
  }

  // ---- examples -------------------------------------------------------------------------
  function renderList(res, append) {
    var list = $("vw-list");
    if (!append) list.textContent = "";
    res.items.forEach(function (it) {
      var li = node("li", { "data-pos": it.pos, title: it.text }, list);
      node("span", { "class": "vw-idx" }, li, "#" + it.index);
      node("span", { "class": "vw-text" }, li, it.text);
      if (it.pos === current.pos) li.classList.add("vw-current");
      li.addEventListener("click", function () { openExample(it.pos); });
    });
    current.listNext = res.next;
    $("vw-more").hidden = res.next === null || res.next === undefined;
    var shown = list.children.length;
    $("vw-count").textContent = current.query ?
      shown + (res.next !== null ? "+" : "") + " matching \u201c" + current.query + "\u201d" :
      shown + " of " + info.examples + " examples";
  }

  function search(q, append) {
    current.query = q;
    var offset = append ? current.listNext || 0 : 0;
    return getJSON("/api/examples?limit=50&offset=" + offset + "&q=" + encodeURIComponent(q))
      .then(function (res) { if (q === current.query) renderList(res, append); return res; },
            function (err) { showError(err.message); });
  }

  // `offset`: first query row of a long input's window (the server's default when undefined)
  function openExample(pos, state, offset) {
    showError("");
    var url = "/api/example/" + pos + (offset === undefined || offset === null ? "" : "?offset=" + offset);
    return getJSON(url).then(function (p) {
      if (state) Object.assign(p.state, state);
      current.pos = pos;
      Array.prototype.forEach.call($("vw-list").children, function (li) {
        li.classList.toggle("vw-current", +li.getAttribute("data-pos") === pos);
      });
      return AttnScope.mount($("attnscope-root"), p, {
        neuronLoader: function (layer) {
          return getJSON("/api/example/" + pos + "/neuron?layer=" + layer);
        },
        windowLoader: function (o, st) {
          return openExample(pos, { view: st.view, layer: st.layer, heads: st.heads, head: st.head,
                                    hide_special: st.hide_special }, o);
        }
      });
    }).then(function (v) { current.viewer = v; return v; },
            function (err) { showError("example " + pos + ": " + err.message); });
  }

  function openHead(layer, head) {
    var st = { view: "head", layer: layer, heads: [head], head: head };
    var link = $("vw-head-link"), name = layerName(layer) + "-" + (head + 1);
    if (info.head_pages) {  // the head's own page: its statistics, labels and top examples
      link.href = "/head/" + name;
      link.textContent = "Open head " + name + "'s page (its top examples over the corpus)";
      link.hidden = false;
    }
    if (current.viewer) return current.viewer.setState(st);
    return openExample(0, st);
  }

  // ---- results --------------------------------------------------------------------------
  function colour(v, lo, hi) {
    var t = hi > lo ? (v - lo) / (hi - lo) : 0.5;
    return "rgb(" + Math.round(255 - 215 * t) + "," + Math.round(255 - 170 * t) + "," + Math.round(255 - 80 * t) + ")";
  }

  function renderStat(stat, box) {
    box.querySelectorAll("svg").forEach(function (s) { s.remove(); });
    var L = stat.values.length, H = stat.values[0].length, c = Math.max(8, Math.min(22, Math.floor(290 / H)));
    var lo = Infinity, hi = -Infinity;
    stat.values.forEach(function (r) { r.forEach(function (v) { if (v !== null) { lo = Math.min(lo, v); hi = Math.max(hi, v); } }); });
    var s = svgNode("svg", { width: 24 + H * c, height: 18 + L * c, "class": "vw-grid" }, box);
    for (var l = 0; l < L; l++) {
      svgNode("text", { x: 20, y: 18 + l * c + c * 0.7, "text-anchor": "end", "font-size": 10 }, s, layerName(l));
      for (var h = 0; h < H; h++) {
        (function (l, h) {
          var v = stat.values[l][h];
          var r = svgNode("rect", { x: 24 + h * c, y: 18 + l * c, width: c - 1, height: c - 1,
                                    fill: v === null ? "#eee" : colour(v, lo, hi), "class": "vw-cell",
                                    "data-layer": l, "data-head": h }, s);
          svgNode("title", null, r, "head " + layerName(l) + "-" + (h + 1) + ": " + (v === null ? "n/a" : v.toPrecision(4)));
          r.addEventListener("click", function () { openHead(l, h); });
        })(l, h);
      }
    }
    for (h = 0; h < H; h++) svgNode("text", { x: 24 + h * c + c / 2, y: 12, "text-anchor": "middle", "font-size": 10 }, s, String(h + 1));
    // the colour scale: ten steps from the lowest value to the highest, with both ends written
    var k = 10, w = Math.max(12, Math.floor((H * c) / k));
    var scale = svgNode("svg", { width: 24 + k * w + 50, height: 30, "class": "vw-scale" }, box);
    for (var i = 0; i < k; i++)
      svgNode("rect", { x: 24 + i * w, y: 2, width: w, height: 10, fill: colour(lo + (hi - lo) * (i + 0.5) / k, lo, hi) }, scale);
    var fmt = function (v) { return isFinite(v) ? (+v.toPrecision(3)).toString() : "n/a"; };
    svgNode("text", { x: 24, y: 26, "font-size": 10, "class": "vw-scale-lo" }, scale, fmt(lo));
    svgNode("text", { x: 24 + k * w, y: 26, "font-size": 10, "text-anchor": "end", "class": "vw-scale-hi" }, scale, fmt(hi));
  }

  function renderScatter(sc, box) {
    box.textContent = "";
    if (!sc) { box.textContent = "no clustering result"; return; }
    node("div", { "class": "vw-muted" }, box, sc.source);
    var W = 300, Hh = 260, pad = 12, xs = sc.points.map(function (p) { return p.x; }), ys = sc.points.map(function (p) { return p.y; });
    var x0 = Math.min.apply(null, xs), x1 = Math.max.apply(null, xs), y0 = Math.min.apply(null, ys), y1 = Math.max.apply(null, ys);
    var sx = function (x) { return pad + (x1 > x0 ? (x - x0) / (x1 - x0) : 0.5) * (W - 2 * pad); };
    var sy = function (y) { return Hh - pad - (y1 > y0 ? (y - y0) / (y1 - y0) : 0.5) * (Hh - 2 * pad); };
    var labels = [];
    sc.points.forEach(function (p) { if (labels.indexOf(p.label) < 0) labels.push(p.label); });
    var s = svgNode("svg", { width: W, height: Hh, "class": "vw-scatter" }, box);
    svgNode("rect", { x: 0, y: 0, width: W, height: Hh, fill: "#fafafa", stroke: "#ddd" }, s);
    sc.points.forEach(function (p) {
      var c = svgNode("circle", { cx: sx(p.x), cy: sy(p.y), r: 5, fill: AttnScope.headColour(labels.indexOf(p.label)),
                                  "fill-opacity": 0.8, "class": "vw-point", "data-layer": p.layer, "data-head": p.head }, s);
      svgNode("title", null, c, layerName(p.layer) + "-" + (p.head + 1) + (p.label ? " (" + p.label + ")" : ""));
      c.addEventListener("click", function () { openHead(p.layer, p.head); });
    });
    var legend = node("div", { "class": "vw-legend" }, box);
    labels.forEach(function (lab, i) {
      var sp = node("span", { style: "margin-right:8px;border-left:10px solid " + AttnScope.headColour(i) + ";padding-left:3px" }, legend, lab || "(no label)");
    });
  }

  function loadResults() {
    return getJSON("/api/results").then(function (r) {
      var box = $("vw-stats");
      box.textContent = "";
      if (!r.stats.length) box.textContent = r.folder
        ? "no per-head statistics in " + r.folder + " (no table with one row per head, no [layer, head] array)"
        : "no per-head results (start with --results DIR)";
      else {
        var sel = node("select", { id: "vw-stat-select" }, box);
        r.stats.forEach(function (s, i) { node("option", { value: i }, sel, s.name); });
        sel.addEventListener("change", function () { renderStat(r.stats[+sel.value], box); });
        renderStat(r.stats[0], box);
      }
      renderScatter(r.scatter, $("vw-scatter"));
      $("vw-problems").textContent = r.problems.join("\n");
      return r;
    }, function (err) { $("vw-stats").textContent = "results unavailable: " + err.message; });
  }

  // ---- start ----------------------------------------------------------------------------
  $("vw-store").textContent = info.store + " \u00b7 " + info.examples + " examples \u00b7 " +
    (info.summary.model || "?") + " \u00b7 " + info.summary.layers + "\u00d7" + info.summary.heads + " heads \u00b7 " + info.summary.level + " level";
  var timer = null;
  $("vw-search").addEventListener("input", function (ev) {
    clearTimeout(timer);
    var q = ev.target.value;
    timer = setTimeout(function () { search(q, false); }, 150);
  });
  $("vw-more").addEventListener("click", function () { search(current.query, true); });
  function loadResultViews() {
    var box = $("vw-resviews");
    return getJSON("/api/results-views").then(function (r) {
      if (!r.attribution && !r.profiles.length && !r.sinks.length) {
        box.setAttribute("data-ready", "true");
        return r;
      }
      return AttnScope.mountResults(box, r).then(function () { return r; });
    }, function (err) { box.textContent = "results views unavailable: " + err.message; });
  }

  if (!info.examples) $("attnscope-root").textContent = "no examples to show (no store, or an empty one)";
  var ready = Promise.all([search("", false), loadResults(), loadResultViews()]).then(function () {
    return info.examples ? openExample(0) : null;
  });
  window.attnscopeViewer = { openExample: openExample, openHead: openHead, search: search, ready: ready,
                             current: current };
})();
