/* attnscope long-document page: one head over a long document, drawn from viz/long_page.py
 * (long_page_payload): its per-row profiles along the document, and its whole row at a query
 * (the rows the page carries, or, served by `attnscope serve --long`, any token clicked: one
 * request, computed on demand; there also any other head picked: its profiles and rows). Needs attnscope.js (AttnScope). Tokens go in with textContent.
 */
(function (global) {
  "use strict";

  var A = global.AttnScope, el = A.el, svg = A.svg;
  var WIDTH = 1200;

  function fmt(x, d) { return Number(x).toFixed(d === undefined ? 3 : d); }

  function lineChart(parent, values, edges, n, title, mark) {
    var h = 70, top = 16, left = 56, w = WIDTH - left - 8;
    var lo = Math.min.apply(null, values), hi = Math.max.apply(null, values);
    if (!(hi > lo)) { hi = lo + 1e-9; }
    var s = svg("svg", { width: WIDTH, height: h + top + 22, "class": "lp-chart" }, parent);
    svg("text", { x: left, y: 11, "class": "lp-axis" }, s, title);
    svg("text", { x: left - 4, y: top + 8, "text-anchor": "end", "class": "lp-axis" }, s, fmt(hi));
    svg("text", { x: left - 4, y: top + h, "text-anchor": "end", "class": "lp-axis" }, s, fmt(lo));
    var pts = values.map(function (v, i) {
      var mid = (edges[i] + edges[i + 1]) / 2;
      return (left + w * mid / n).toFixed(1) + "," + (top + h - h * (v - lo) / (hi - lo)).toFixed(1);
    });
    svg("polyline", { points: pts.join(" "), fill: "none", stroke: "#1f77b4", "stroke-width": 1.2 }, s);
    svg("line", { x1: left, x2: left + w, y1: top + h, y2: top + h, stroke: "#999" }, s);
    svg("text", { x: left, y: top + h + 16, "class": "lp-axis" }, s, "token 0");
    svg("text", { x: left + w, y: top + h + 16, "text-anchor": "end", "class": "lp-axis" }, s, "token " + (n - 1));
    if (mark !== undefined) {
      var x = left + w * (mark + 0.5) / n;
      svg("line", { x1: x, x2: x, y1: top, y2: top + h, stroke: "#d62728", "stroke-width": 1.5, "class": "lp-mark" }, s);
    }
    return s;
  }

  function Page(root, p) {
    this.root = root; this.p = p;
    this.rows = {};
    var self = this;
    p.rows.forEach(function (r) { self.rows[r.query] = r; });
  }

  Page.prototype.build = function () {
    var p = this.p, root = this.root, self = this;
    root.setAttribute("data-head", A.layerName(p.layer_numbers, p.layer) + "-" + (p.head + 1));
    el("h2", { "class": "rs-title" }, root, p.title);
    el("div", { "class": "as-muted" }, root, p.n.toLocaleString() + " tokens from " + p.source +
       (p.seconds && p.seconds.forward ? " \u00b7 one forward pass: " + fmt(p.seconds.forward, 1) + " s" : "") +
       " \u00b7 head " + A.layerName(p.layer_numbers, p.layer) + "-" + (p.head + 1) + " of " + p.num_layers + " x " + p.num_heads +
       " (1-indexed) \u00b7 no n x n map was made");
    var held = (p.roles || []).filter(function (r) { return r.holds; });
    el("div", { "class": "lp-roles" }, root, "What it does here: " + (held.length
       ? held.map(function (r) { return r.role + " (mean " + r.statistic + " " + fmt(r.mean) + " > " + r.threshold + ")"; }).join("; ")
       : "neither an attention sink nor a previous-token head (" + (p.roles || []).map(function (r) {
           return r.statistic + " " + fmt(r.mean) + " \u2264 " + r.threshold; }).join(", ") + ")") +
       ", rows 1 to " + (p.n - 1) + " of this document");
    if (p.head_api) this.headPicker();
    var prof = el("section", { "class": "lp-profiles" }, root);
    el("h3", null, prof, "Along the document (each row's value, averaged over " + (p.profile_edges.length - 1) + " stretches)");
    var names = { sink: "mass on the first token (sink)", previous: "mass on the token before", entropy: "row entropy (nats)",
                  max_weight: "largest weight of a row", distance: "mean distance to the attended tokens" };
    Object.keys(p.profiles).forEach(function (k) {
      lineChart(prof, p.profiles[k], p.profile_edges, p.n, names[k] || k);
    });
    var q = el("section", { "class": "lp-query" }, root);
    el("h3", null, q, "One query's row");
    var bar = el("label", { "class": "as-toolbar" }, q, "query ");
    this.pick = el("select", { "class": "lp-pick" }, bar);
    this.fillPick();
    this.pick.addEventListener("change", function () { self.show(+self.pick.value); });
    el("span", { "class": "as-muted" }, bar, p.api ? "  or click any token of the document below"
       : "  (this page carries the rows of the queries named; `attnscope serve --long` computes any token's)");
    this.stage = el("div", { "class": "lp-stage" }, q);
    this.docBox = el("div", { "class": "lp-doc", tabindex: "0" }, root);
    this.status = el("div", { "class": "as-muted lp-status" }, root);
    if (p.rows.length) this.show(p.rows[0].query);
    else this.drawDoc(p.n - 1, null);
  };

  // served: another head of the same forward pass, its profiles and the rows of the queries shown
  Page.prototype.headPicker = function () {
    var p = this.p, self = this, bar = el("div", { "class": "as-toolbar lp-heads" }, this.root);
    var pick = function (label, count, value, name) {
      var sel = el("select", { "class": "lp-" + label }, el("label", null, bar, label + " "));
      for (var i = 0; i < count; i++) el("option", { value: i }, sel, name(i));
      sel.value = value;
      sel.addEventListener("change", function () { self.switchHead(+self.layerPick.value, +self.headPick.value); });
      return sel;
    };
    this.layerPick = pick("layer", p.num_layers, p.layer, function (l) { return A.layerName(p.layer_numbers, l); });
    this.headPick = pick("head", p.num_heads, p.head, function (h) { return String(h + 1); });
  };

  Page.prototype.switchHead = function (layer, head) {
    var self = this, p = this.p, shown = this.root.getAttribute("data-query");
    var queries = Object.keys(this.rows).join(","), t0 = performance.now();
    this.status.textContent = "computing head " + A.layerName(p.layer_numbers, layer) + "-" + (head + 1) + "\u2026";
    return fetch(p.head_api + "?layer=" + layer + "&head=" + head + "&queries=" + queries)
      .then(function (r) { return r.json().then(function (j) { if (!r.ok) throw new Error(j.error || r.status); return j; }); })
      .then(function (part) {
        var page = new Page(self.root, Object.assign({}, p, part));
        self.root.textContent = "";
        page.build();
        global.attnscopeLong = page;
        if (shown !== null && page.rows[shown]) page.draw(page.rows[shown]);
        page.status.textContent = "head " + A.layerName(p.layer_numbers, layer) + "-" + (head + 1) + " in " +
          fmt((performance.now() - t0) / 1000, 2) + " s";
        return page;
      }, function (err) { self.status.textContent = "could not compute the head: " + err.message; });
  };

  Page.prototype.fillPick = function () {
    var p = this.p, self = this;
    this.pick.textContent = "";
    Object.keys(this.rows).map(Number).sort(function (a, b) { return a - b; }).forEach(function (i) {
      el("option", { value: i }, self.pick, i + ": " + JSON.stringify(p.labels[i]));
    });
  };

  Page.prototype.show = function (query) {
    var self = this, row = this.rows[query];
    if (row) { this.draw(row); return Promise.resolve(row); }
    if (!this.p.api) { this.status.textContent = "no row for token " + query + " on this page"; return Promise.resolve(null); }
    var t0 = performance.now();
    this.status.textContent = "computing the row of token " + query + "\u2026";
    return fetch(this.p.api + "?layer=" + this.p.layer + "&head=" + this.p.head + "&query=" + query)
      .then(function (r) { return r.json().then(function (j) { if (!r.ok) throw new Error(j.error || r.status); return j; }); })
      .then(function (r) {
        self.rows[r.query] = r; self.fillPick(); self.draw(r);
        self.status.textContent = "row of token " + query + " in " + fmt((performance.now() - t0) / 1000, 2) + " s";
        return r;
      }, function (err) { self.status.textContent = "could not compute the row: " + err.message; });
  };

  Page.prototype.draw = function (r) {
    var p = this.p, st = this.stage;
    this.pick.value = r.query;
    st.textContent = "";
    this.root.setAttribute("data-query", r.query);
    el("div", null, st, "Token " + r.query + " " + JSON.stringify(p.labels[r.query]) + ": entropy " +
       fmt(r.entropy) + " nats, largest weight " + fmt(r.max_weight) + ", mass on the first token " + fmt(r.sink));
    lineChart(st, r.strip, r.strip_edges, p.n, "its attention over the document (mass per stretch)", r.query);
    var b = el("div", { "class": "lp-buckets" }, st);
    el("div", { "class": "lp-axis" }, b, "mass by distance |query - key|:");
    var s = svg("svg", { width: WIDTH, height: 64 }, b), bw = Math.min(60, Math.floor((WIDTH - 20) / r.buckets.length));
    r.buckets.forEach(function (k, i) {
      var hgt = Math.round(40 * k.mass);
      svg("rect", { x: 10 + i * bw, y: 44 - hgt, width: bw - 4, height: hgt, fill: "#1f77b4", "class": "lp-bucket" }, s);
      svg("text", { x: 10 + i * bw + (bw - 4) / 2, y: 58, "text-anchor": "middle", "class": "lp-axis" }, s,
          k.lo === k.hi ? String(k.lo) : k.lo + "-" + k.hi);
      svg("title", null, s.lastChild.previousSibling, fmt(k.mass));
    });
    el("h4", null, st, "Its strongest keys, in context");
    var list = el("ol", { "class": "lp-top" }, st);
    r.top.slice(0, 10).forEach(function (kw) {
      var li = el("li", { "data-key": kw[0] }, list);
      el("span", { "class": "lp-w" }, li, fmt(kw[1]) + " @ " + kw[0] + " (" + (r.query - kw[0]) + " back)  ");
      for (var j = Math.max(0, kw[0] - 6); j <= Math.min(p.n - 1, kw[0] + 6); j++) {
        el("span", { "class": "hp-tok" + (j === kw[0] ? " hp-key lp-hit" : "") + (j === r.query ? " hp-query" : ""),
                     title: p.raw[j] }, li, p.labels[j]);
      }
    });
    this.drawDoc(r.query, r);
  };

  // the document around the query: its tokens, the strongest keys shaded; a click picks a token
  Page.prototype.drawDoc = function (query, r) {
    var p = this.p, box = this.docBox, self = this, span = 300;
    box.textContent = "";
    el("h3", null, box, "The document around token " + query + " (tokens " + Math.max(0, query - span) +
       " to " + Math.min(p.n - 1, query + 40) + ")");
    var w = {};
    if (r) r.top.forEach(function (kw) { w[kw[0]] = kw[1]; });
    var line = el("div", { "class": "hp-tokens" }, box);
    for (var i = Math.max(0, query - span); i <= Math.min(p.n - 1, query + 40); i++) {
      var t = el("span", { "class": "hp-tok lp-tok" + (i === query ? " hp-query" : ""), "data-pos": i, title: i + ": " + p.raw[i] }, line, p.labels[i]);
      if (i in w) t.style.background = "rgba(31, 119, 180, " + Math.sqrt(w[i]).toFixed(3) + ")";
    }
    line.addEventListener("click", function (ev) {
      var pos = ev.target.getAttribute && ev.target.getAttribute("data-pos");
      if (pos !== null && pos !== undefined) self.show(+pos);
    });
  };

  function mountLongPage(root, p) {
    root.setAttribute("data-ready", "false");
    root.textContent = "";
    root.classList.add("attnscope", "lp-page");
    var page = new Page(root, p);
    page.build();
    global.attnscopeLong = page;
    root.setAttribute("data-ready", "true");
    return Promise.resolve(root);
  }

  A.mountLongPage = mountLongPage;
})(window);
