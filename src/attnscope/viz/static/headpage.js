/* attnscope head page: one head across the corpus, drawn from viz/head_page.py
 * (head_page_payload): its statistics with intervals and ranks, its labels with their
 * evidence, and per statistic the examples where it scores highest (and typical ones) as
 * attention strips. Needs attnscope.js (AttnScope). No network; every token goes in with
 * textContent.
 */
(function (global) {
  "use strict";

  var A = global.AttnScope, el = A.el;

  function fmt(x, digits) {
    if (x === null || x === undefined) return "";
    return Number(x).toFixed(digits === undefined ? 3 : digits);
  }

  // the units an entry draws: the whole example when short, else the query and each key with
  // a few neighbours, gaps marked
  function shownUnits(n, entry, all) {
    if (all || n <= 48) { var every = []; for (var i = 0; i < n; i++) every.push(i); return every; }
    var keep = {};
    function around(c, r) { for (var j = Math.max(0, c - r); j <= Math.min(n - 1, c + r); j++) keep[j] = true; }
    around(entry.query, 6);
    entry.keys.forEach(function (k) { around(k, 3); });
    return Object.keys(keep).map(Number).sort(function (a, b) { return a - b; });
  }

  function drawStrip(parent, p, entry, all) {
    var u = p.units[String(entry.example)], labels = u.labels, n = labels.length;
    var href = p.pages[String(entry.example)];
    var box = href ? el("a", { "class": "hp-strip", href: href, target: "_blank", rel: "noopener",
                               "data-example": entry.example, "data-query": entry.query }, parent)
                   : el("div", { "class": "hp-strip", tabindex: "0", role: "button",
                                 "data-example": entry.example, "data-query": entry.query }, parent);
    var qtext = labels[entry.query];
    el("div", { "class": "hp-strip-head" }, box, "example " + entry.example + " \u00b7 value " +
       fmt(entry.value) + " \u00b7 query " + JSON.stringify(qtext) + " (position " + entry.query + ")" +
       (href ? " \u00b7 opens its head view" : ""));
    var line = el("div", { "class": "hp-tokens" }, box);
    var weight = {};
    entry.keys.forEach(function (k, i) { weight[k] = entry.weights[i]; });
    var prev = -1;
    shownUnits(n, entry, all).forEach(function (i) {
      if (prev >= 0 && i > prev + 1) el("span", { "class": "hp-gap" }, line, " \u2026 ");
      else if (prev >= 0 && u.space && u.space[i]) line.appendChild(document.createTextNode(" "));  // a new word
      prev = i;
      var cls = "hp-tok" + (i === entry.query ? " hp-query" : "") + (i in weight ? " hp-key" : "");
      var t = el("span", { "class": cls, title: u.raw[i] + (i in weight ? " \u00b7 weight " + fmt(weight[i]) : "") }, line, labels[i]);
      if (i in weight) t.style.background = "rgba(31, 119, 180, " + Math.sqrt(Math.max(0, weight[i])).toFixed(3) + ")";
    });
    el("div", { "class": "hp-keys as-muted" }, box, "strongest keys: " + entry.keys.map(function (k, i) {
      return JSON.stringify(labels[k]) + " " + fmt(entry.weights[i]);
    }).join(", "));
    if (!href) {
      var toggle = function () {  // the whole example, or back to the query and keys in context
        var other = drawStrip(document.createDocumentFragment(), p, entry, !all);
        box.parentNode.replaceChild(other, box);
        other.focus();
      };
      box.addEventListener("click", toggle);
      box.addEventListener("keydown", function (ev) { if (ev.key === "Enter" || ev.key === " ") { ev.preventDefault(); toggle(); } });
    }
    return box;
  }

  function table(parent, head, rows) {
    var t = el("table", { "class": "hp-table" }, parent), tr = el("tr", null, el("thead", null, t));
    head.forEach(function (h) { el("th", null, tr, h); });
    var body = el("tbody", null, t);
    rows.forEach(function (r) { var row = el("tr", null, body); r.forEach(function (c) { el("td", null, row, c); }); });
    return t;
  }

  function mountHeadPage(root, p) {
    root.setAttribute("data-ready", "false");
    root.textContent = "";
    root.classList.add("attnscope", "hp-page");
    el("h2", { "class": "rs-title" }, root, p.title);
    el("div", { "class": "as-muted" }, root, "Layer " + p.head.split("-")[0] + ", head " + (p.index + 1) +
       " (1-indexed, as every page names heads)" + (p.model ? " \u00b7 model " + p.model : ""));

    var lab = el("section", { "class": "hp-labels" }, root);
    el("h3", null, lab, "Labels");
    if (!p.labels.length) el("div", { "class": "as-muted" }, lab, "no family gave this head a label");
    var ul = el("ul", null, lab);
    p.labels.forEach(function (l) {
      var li = el("li", null, ul);
      el("b", null, li, l.label);
      el("span", null, li, " \u2014 " + l.evidence + " (" + l.family + ")");
    });

    if (p.stats.length) {
      var st = el("section", { "class": "hp-stats" }, root);
      el("h3", null, st, "Statistics (mean over examples of each example's mean over its rows)");
      table(st, ["statistic", "value", "95% interval", "rank", "examples"], p.stats.map(function (s) {
        return [s.what, fmt(s.value, s.digits), s.low === null ? "" : "[" + fmt(s.low, s.digits) + ", " + fmt(s.high, s.digits) + "]",
                s.rank === null ? "" : s.rank + " of " + s.of, s.examples === null ? "" : String(s.examples)];
      }));
      el("div", { "class": "as-muted" }, st, "Rank 1 is the highest value among all heads. The interval is the " +
         "mean \u00b1 1.96 standard errors of the per-example values.");
    }
    p.evidence.forEach(function (ev) {
      var sec = el("section", { "class": "hp-evidence" }, root);
      el("h3", null, sec, ev.title);
      table(sec, ["what", "value", "rank", "items"], ev.rows.map(function (r) {
        return [r.what, fmt(r.value, 1), r.rank + " of " + r.of, r.count === null ? "" : String(r.count)];
      }));
    });

    var stats = Object.keys(p.examples);
    var ex = el("section", { "class": "hp-examples" }, root);
    el("h3", null, ex, "Where this head does it");
    if (!stats.length) {
      el("div", { "class": "as-muted" }, ex, "no top examples in this folder");
    } else {
      var rank = {};
      p.stats.forEach(function (s) { rank[s.key] = s.rank === null ? 1e9 : s.rank; });
      stats.sort(function (a, b) { return rank[a] - rank[b]; });  // the head's strongest first
      var what = {};
      p.stats.forEach(function (s) { what[s.key] = s.what; });
      var bar = el("label", { "class": "as-toolbar" }, ex, "statistic ");
      var pick = el("select", { "class": "hp-stat" }, bar);
      stats.forEach(function (s) { el("option", { value: s }, pick, what[s] || s); });
      var stage = el("div", { "class": "hp-stage" }, ex);
      var draw = function () {
        stage.textContent = "";
        var cell = p.examples[pick.value];
        el("h4", null, stage, "Top " + cell.top.length + ": the examples with the highest value");
        var top = el("div", { "class": "hp-top" }, stage);
        cell.top.forEach(function (e) { drawStrip(top, p, e, false); });
        if (cell.typical.length) {
          el("h4", null, stage, "Typical: sampled examples nearest this head's mean");
          var typ = el("div", { "class": "hp-typical" }, stage);
          cell.typical.forEach(function (e) { drawStrip(typ, p, e, false); });
        }
      };
      pick.addEventListener("change", draw);
      draw();
      if (p.params) el("div", { "class": "as-muted" }, ex, "Each strip: the query unit (boxed) whose own row " +
         "scores highest in that example, and its " + p.params.keys + " strongest keys (shaded by weight). " +
         "Kept during the run's one pass: the top " + p.params.k + " per head and statistic, typical ones " +
         "from a seeded sample of " + p.params.sample + " examples (seed " + p.params.seed + ").");
    }
    if (p.notes.length) el("div", { "class": "as-note" }, root, p.notes.join(" "));
    root.setAttribute("data-ready", "true");
    return Promise.resolve(root);
  }

  A.mountHeadPage = mountHeadPage;
})(window);
