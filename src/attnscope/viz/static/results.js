/* attnscope results views: per-example attribution maps side by side, per-head profiles
 * (attention against distance or query position), and the sink-mass heatmap, drawn from
 * attnscope/views.py (results_payload). Needs attnscope.js (AttnScope). No network;
 * every token and name goes in with textContent.
 */
(function (global) {
  "use strict";

  var A = global.AttnScope, el = A.el, svg = A.svg, SVGNS = A.SVGNS;
  var numbers = null;  // the model's own layer numbers (payload.layer_numbers: a hybrid's), set by mountResults
  function layerName(l) { return A.layerName(numbers, l); }

  // ---- attribution maps -----------------------------------------------------------------
  function Attribution(box, ap, maps) {
    this.box = box; this.ap = ap; this.maps = maps;  // maps[k]: decoded f32 blob of ap.methods[k]
    this.layer = ap.num_layers - 1;
    this.chosen = ap.methods.map(function () { return true; });
    this.build();
  }

  Attribution.prototype.build = function () {
    var self = this, ap = this.ap;
    el("h3", null, this.box, "Attribution maps of example " + ap.index + (ap.model ? " (" + ap.model + ")" : ""));
    el("div", { "class": "as-muted" }, this.box, "rows: from (output token), columns: to (input token); " +
       "each map is coloured to its own largest value; source: " + ap.source);
    var bar = el("div", { "class": "as-toolbar rs-attr-bar" }, this.box);
    ap.methods.forEach(function (m, k) {
      var lb = el("label", null, bar);
      var cb = el("input", { type: "checkbox", "class": "rs-method", "data-method": m.key }, lb);
      cb.checked = true;
      el("span", null, lb, " " + m.key);
      cb.addEventListener("change", function () { self.chosen[k] = cb.checked; self.render(); });
    });
    if (ap.methods.some(function (m) { return m.per_layer; })) {
      var ll = el("label", null, bar, "layer ");
      var ls = this.layerSelect = el("select", { "class": "rs-layer" }, ll);
      for (var l = 0; l < ap.num_layers; l++) el("option", { value: l }, ls, layerName(l));
      ls.value = this.layer;
      ls.addEventListener("change", function () { self.layer = +ls.value; self.render(); });
    }
    this.notes = el("div", { "class": "as-note" }, this.box, ap.notes.join(" "));
    this.stage = el("div", { "class": "rs-attr-maps" }, this.box);
    this.tip = el("div", { "class": "as-tip", hidden: "" }, this.box);
  };

  // the [n n] matrix of method k at the current layer, as a function (r, c) -> value
  Attribution.prototype.matrix = function (k) {
    var m = this.ap.methods[k], d = this.maps[k].data, n = this.ap.tokens.length;
    var base = m.per_layer ? this.layer * n * n : 0;
    return function (r, c) { return d[base + r * n + c]; };
  };

  Attribution.prototype.render = function () {
    var self = this, ap = this.ap, raw = ap.tokens, toks = ap.token_text || raw, n = toks.length;
    this.stage.textContent = "";
    var cell = Math.max(3, Math.min(14, Math.floor(360 / n))), labels = cell >= 8, maxW = 0;
    if (labels) toks.forEach(function (t) { maxW = Math.max(maxW, A.textWidth(A.shorten(t, 14))); });
    var lm = labels ? Math.ceil(maxW) + 8 : 6, top = 36 + (labels ? Math.ceil(maxW) + 8 : 0);
    var shown = 0;
    ap.methods.forEach(function (m, k) {
      if (!self.chosen[k]) return;
      shown++;
      var f = self.matrix(k), top1 = 0;
      for (var r = 0; r < n; r++) for (var c = 0; c < n; c++) top1 = Math.max(top1, f(r, c));
      var width = lm + n * cell + 8, height = top + n * cell + 8;
      var root = svg("svg", { xmlns: SVGNS, width: width, height: height, viewBox: "0 0 " + width + " " + height,
                              "class": "as-svg rs-attr-map", "data-method": m.key }, self.stage);
      svg("rect", { x: 0, y: 0, width: width, height: height, fill: "#fff" }, root);
      svg("text", { x: 4, y: 14, "class": "as-caption" }, root, A.shorten(m.title, 48));
      svg("text", { x: 4, y: 28, "class": "as-axis" }, root, (m.per_layer ? "layer " + layerName(self.layer) + ", " : "") +
          "max " + top1.toPrecision(3));
      var im = A.pixelImage(root, A.gridImage(n, n, function (r, c) { return top1 > 0 ? f(r, c) / top1 : 0; }, A.blues),
                            lm, top, n * cell, n * cell);
      svg("rect", { x: lm, y: top, width: n * cell, height: n * cell, fill: "none", stroke: "#999" }, root);
      if (labels) {
        toks.forEach(function (t, i) {
          var rt = svg("text", { x: lm - 3, y: top + i * cell + cell / 2 + 4, "text-anchor": "end", "class": "as-token rs-row" }, root, A.shorten(t, 14));
          svg("title", null, rt, raw[i]);
          var x = lm + i * cell + cell / 2 + 4, y = top - 3;
          var ct = svg("text", { x: x, y: y, transform: "rotate(-90 " + x + " " + y + ")", "class": "as-token rs-col" }, root, A.shorten(t, 14));
          svg("title", null, ct, raw[i]);
        });
      }
      im.addEventListener("mousemove", function (ev) {
        var b = im.getBoundingClientRect();
        var r = Math.floor((ev.clientY - b.top) / b.height * n), c = Math.floor((ev.clientX - b.left) / b.width * n);
        if (r < 0 || c < 0 || r >= n || c >= n) return;
        var t = self.tip, outer = self.box.getBoundingClientRect();
        t.textContent = m.key + ": " + toks[r] + " \u2192 " + toks[c] + ": " + f(r, c).toPrecision(4);
        t.hidden = false;
        t.style.left = (ev.clientX - outer.left + 12) + "px"; t.style.top = (ev.clientY - outer.top + 12) + "px";
      });
      im.addEventListener("mouseleave", function () { self.tip.hidden = true; });
    });
    this.box.setAttribute("data-maps", String(shown));
  };

  // ---- profiles and sink heatmap --------------------------------------------------------
  function Profiles(box, profiles) {
    var self = this;
    this.box = box; this.profiles = profiles; this.which = 0; this.layer = 0;
    el("h3", null, box, "Per-head profiles");
    var bar = el("div", { "class": "as-toolbar" }, box);
    var ps = el("select", { "class": "rs-profile" }, bar);
    profiles.forEach(function (p, i) { el("option", { value: i }, ps, p.name + ": " + p.title); });
    ps.addEventListener("change", function () { self.which = +ps.value; self.render(); });
    var ll = el("label", null, bar, "layer ");
    var ls = el("select", { "class": "rs-profile-layer" }, ll);
    for (var l = 0; l < profiles[0].values.length; l++) el("option", { value: l }, ls, layerName(l));
    ls.addEventListener("change", function () { self.layer = +ls.value; self.render(); });
    this.stage = el("div", null, box);
  }

  Profiles.prototype.render = function () {
    var p = this.profiles[this.which], layer = this.layer;
    this.stage.textContent = "";
    var root = svg("svg", { xmlns: SVGNS, width: 10, height: 10, "class": "as-svg rs-profile-chart" }, this.stage);
    A.drawProfile(root, p.buckets, p.values[layer], "Layer " + layerName(layer) + ": " + p.title + " (" + p.source + ")",
                  function (h) { return layerName(layer) + "-" + (h + 1); }, p.axis, A.stageWidth(this.stage));
    this.box.setAttribute("data-profile", p.name);
  };

  function drawSink(box, sink) {
    el("h3", null, box, "Sink mass per head (" + sink.name + ")");
    var L = sink.values.length, H = sink.values[0].length, c = Math.max(10, Math.min(28, Math.floor(480 / H)));
    var width = 30 + H * c + 4, height = 22 + L * c + 4;
    var root = svg("svg", { xmlns: SVGNS, width: width, height: height, "class": "as-svg rs-sink" }, box);
    svg("rect", { x: 0, y: 0, width: width, height: height, fill: "#fff" }, root);
    for (var h = 0; h < H; h++) svg("text", { x: 30 + h * c + c / 2, y: 14, "text-anchor": "middle", "class": "as-axis" }, root, String(h + 1));
    for (var l = 0; l < L; l++) {
      svg("text", { x: 26, y: 22 + l * c + c * 0.7, "text-anchor": "end", "class": "as-axis" }, root, layerName(l));
      for (h = 0; h < H; h++) {
        var v = sink.values[l][h], rgb = A.blues(v === null ? 0 : v);
        var r = svg("rect", { x: 30 + h * c, y: 22 + l * c, width: c - 1, height: c - 1, "class": "rs-sink-cell",
                              fill: v === null ? "#eee" : "rgb(" + rgb.join(",") + ")" }, root);
        svg("title", null, r, "head " + layerName(l) + "-" + (h + 1) + ": " + (v === null ? "n/a" : v.toFixed(3)) +
            (sink.threshold !== null && v !== null && v > sink.threshold ? " (sink head)" : ""));
      }
    }
    el("div", { "class": "as-muted" }, box, "rows: layers, columns: heads (1-indexed); white = 0, dark blue = 1" +
       (sink.threshold !== null ? "; a sink head puts more than " + sink.threshold + " on the first token" : ""));
  }

  // draw every results view of `payload` (views.py results_payload) into `root`
  function mountResults(root, payload) {
    root.setAttribute("data-ready", "false");
    root.textContent = "";
    root.classList.add("attnscope");
    numbers = payload.layer_numbers || null;
    el("h2", { "class": "rs-title" }, root, payload.title || ("Results in " + payload.folder));
    var jobs = [];
    if (payload.attribution) {
      var ab = el("section", { "class": "rs-attribution" }, root);
      jobs.push(Promise.all(payload.attribution.methods.map(function (m) { return A.decodeBlob(m.map); }))
        .then(function (maps) { var a = new Attribution(ab, payload.attribution, maps); a.render(); return a; }));
    }
    if (payload.profiles.length) {
      var pb = el("section", { "class": "rs-profiles" }, root);
      var pr = new Profiles(pb, payload.profiles);
      pr.render();
    }
    payload.sinks.forEach(function (s) { drawSink(el("section", { "class": "rs-sinks" }, root), s); });
    if (!payload.attribution && !payload.profiles.length && !payload.sinks.length)
      el("div", { "class": "as-muted rs-empty" }, root, "no attribution maps or long-context profiles in this folder");
    if (payload.problems.length) el("div", { "class": "as-note" }, root, payload.problems.join("\n"));
    return Promise.all(jobs).then(function () { root.setAttribute("data-ready", "true"); return root; },
      function (err) {
        el("div", { "class": "as-error" }, root, "attnscope: could not draw the results: " + (err && err.message ? err.message : err));
        root.setAttribute("data-ready", "error");
        throw err;
      });
  }

  A.mountResults = mountResults;
})(window);
