/* attnscope views: head, model, heatmap and neuron views drawn as SVG from a JSON payload.
 *
 * Written for attnscope; no libraries, no network. Every token reaches the page through
 * textContent (never innerHTML), so an input holding a script tag is shown as text. Tokens are
 * shown as text (payload.token_text: "·Paris" for the byte-level piece "ĠParis"), the raw piece
 * in each label's <title>, shown on hover.
 * Payload: see attnscope/viz/payload.py (page_payload). Blobs ("u8"/"f32") are deflated and
 * base64-encoded; they are inflated with the browser's DecompressionStream.
 *
 * The rules for pair filters and hiding special tokens are the same as in payload.py
 * (head_payload): filters select rows/columns without renormalising; hiding special tokens
 * drops them and divides each row by its mass on the remaining keys.
 */
(function (global) {
  "use strict";

  var SVGNS = "http://www.w3.org/2000/svg";
  // one colour per head: colorcet's glasbey_category10 (category10, then Glasbey et al. 2007's
  // colours chosen to be as far apart as possible): its first 24, any two at least 26.7 apart in
  // CIELAB (the 16 before: 4.6, two of them hard to tell apart)
  var PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b",
                 "#e377c2", "#7f7f7f", "#bcbd22", "#17becf", "#3a0183", "#004301",
                 "#0fffa9", "#5e0040", "#bcbcff", "#d8afa2", "#b80080", "#004e53",
                 "#6b6500", "#7d0200", "#6126ff", "#ffff9a", "#574964", "#8cb894"];
  var MAX_LINES = 30000;
  var FONT = "12px sans-serif";
  var HEAD_FONT = "14px sans-serif";  // the head view's tokens (.as-head-view .as-token)

  function headColour(h) { return PALETTE[h % PALETTE.length]; }

  // ---- decoding -----------------------------------------------------------------------
  function b64ToBytes(s) {
    var bin = atob(s), out = new Uint8Array(bin.length);
    for (var i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
    return out;
  }

  function inflate(bytes) {
    var stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("deflate"));
    return new Response(stream).arrayBuffer().then(function (buf) { return new Uint8Array(buf); });
  }

  function decodeBlob(blob) {
    return inflate(b64ToBytes(blob.data)).then(function (raw) {
      if (blob.dtype === "u8") return { shape: blob.shape, data: raw, scale: 255 };
      if (blob.dtype === "f32") {
        var copy = new Uint8Array(raw.length); copy.set(raw);
        return { shape: blob.shape, data: new Float32Array(copy.buffer), scale: 1 };
      }
      throw new Error("unknown blob dtype " + blob.dtype);
    });
  }

  // ---- DOM helpers ----------------------------------------------------------------------
  function el(tag, attrs, parent, text) {
    var e = document.createElement(tag);
    if (attrs) for (var k in attrs) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    if (parent) parent.appendChild(e);
    return e;
  }

  function svg(tag, attrs, parent, text) {
    var e = document.createElementNS(SVGNS, tag);
    if (attrs) for (var k in attrs) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    if (parent) parent.appendChild(e);
    return e;
  }

  var measureCtx = null;
  function textWidth(s, font) {
    if (!measureCtx) measureCtx = document.createElement("canvas").getContext("2d");
    measureCtx.font = font || FONT;
    return measureCtx.measureText(s).width;
  }

  // how wide the stage can draw without scrolling sideways (a view wider than that is scaled
  // down to it by CSS, so nothing is cut off)
  function stageWidth(stage) {
    return Math.max(320, (stage && stage.clientWidth) || 900);
  }

  // a line's opacity for weight w: the square root, so that weights of a few percent still
  // show (0.04 -> 0.2, 0.25 -> 0.5, 1 -> 1); the order of the weights is kept
  function lineOpacity(w) { return Math.sqrt(Math.max(0, Math.min(1, w))); }

  function shorten(s, max) { return s.length > max ? s.slice(0, max - 1) + "\u2026" : s; }

  // a canvas image (data URL) of a rows x cols grid, colour(v) -> [r, g, b]
  function gridImage(rows, cols, value, colour) {
    var c = document.createElement("canvas");
    c.width = Math.max(1, cols); c.height = Math.max(1, rows);
    var ctx = c.getContext("2d"), img = ctx.createImageData(c.width, c.height);
    for (var r = 0; r < rows; r++) {
      for (var k = 0; k < cols; k++) {
        var rgb = colour(value(r, k)), o = 4 * (r * cols + k);
        img.data[o] = rgb[0]; img.data[o + 1] = rgb[1]; img.data[o + 2] = rgb[2]; img.data[o + 3] = 255;
      }
    }
    ctx.putImageData(img, 0, 0);
    return c.toDataURL("image/png");
  }

  function blues(v) {  // 0 -> white, 1 -> dark blue
    v = Math.max(0, Math.min(1, v));
    return [Math.round(255 - 247 * v), Math.round(255 - 207 * v), Math.round(255 - 148 * v)];
  }

  function diverging(v) {  // -1 blue, 0 white, +1 red
    v = Math.max(-1, Math.min(1, v));
    if (v >= 0) return [255, Math.round(255 - 200 * v), Math.round(255 - 200 * v)];
    return [Math.round(255 + 200 * v), Math.round(255 + 200 * v), 255];
  }

  function pixelImage(parent, href, x, y, w, h) {
    var im = svg("image", { x: x, y: y, width: w, height: h, preserveAspectRatio: "none",
                            style: "image-rendering:pixelated" }, parent);
    im.setAttribute("href", href);
    return im;
  }

  // ---- the viewer -----------------------------------------------------------------------
  function Viewer(root, payload, attn, thumbs, options, outside) {
    this.root = root;
    this.outside = outside || null;  // u8 [L H m]: a long input's shown rows' mass on keys not shown
    this.p = payload;
    this.attn = attn;       // u8 [L H n n]
    this.thumbs = thumbs;   // u8 [L H tq tk]
    this.options = options || {};
    this.neuron = null;     // decoded neuron data
    this.n = payload.tokens.length;   // query units (rows)
    // key units (columns): the same units, except in a cross-attention map (the encoder's)
    this.kt = payload.key_tokens || payload.tokens;
    this.ks = payload.key_special || payload.special;
    // what the labels show: the tokens as text; the raw pieces (tokens, kt) go on hover
    this.text = payload.token_text || payload.tokens;
    this.kx = payload.key_tokens ? (payload.key_token_text || payload.key_tokens) : this.text;
    this.nk = this.kt.length;
    this.L = payload.num_layers;
    this.H = payload.num_heads;
    var s = payload.state;
    this.state = { view: s.view, layer: s.layer, heads: s.heads.slice(), head: s.head,
                   pair_filter: s.pair_filter, hide_special: s.hide_special,
                   min_weight: 0.01, query: 0 };
    this.focus = null;
    this.build();
  }

  Viewer.prototype.value = function (l, h, q, k) {
    return this.attn.data[((l * this.H + h) * this.n + q) * this.nk + k] / 255;
  };

  // rows/cols shown, as in payload.visible_units
  Viewer.prototype.visibleUnits = function (filter, hide) {
    var p = this.p, rows = [], cols = [];
    var src = null, dst = null;
    if (filter && filter !== "all") {
      var parts = filter.split("->"); src = parts[0] === "A" ? 0 : 1; dst = parts[1] === "A" ? 0 : 1;
    }
    if (p.key_tokens) {  // cross-attention: rows are the decoder's units, columns the encoder's
      for (var r = 0; r < this.n; r++) if (!(hide && p.special[r])) rows.push(r);
      for (var c = 0; c < this.nk; c++) if (!(hide && this.ks[c])) cols.push(c);
      return { rows: rows, cols: cols };
    }
    for (var i = 0; i < this.n; i++) {
      if (hide && p.special[i]) continue;
      if (src === null || p.segment[i] === src) rows.push(i);
      if (dst === null || p.segment[i] === dst) cols.push(i);
    }
    return { rows: rows, cols: cols };
  };

  // what the head view shows: {rows, cols, heads, attn: [h][r][c]} (payload.head_payload)
  Viewer.prototype.currentMatrix = function (opts) {
    var st = Object.assign({}, this.state, opts || {});
    var heads = st.view === "heatmap" || st.view === "neuron" ? [st.head] : st.heads;
    var vu = this.visibleUnits(st.pair_filter, st.hide_special), ks = this.ks, nk = this.nk;
    var out = [];
    for (var hi = 0; hi < heads.length; hi++) {
      var m = [];
      for (var ri = 0; ri < vu.rows.length; ri++) {
        var q = vu.rows[ri], denom = 1;
        if (st.hide_special) {
          denom = 0;
          for (var k = 0; k < nk; k++) if (!ks[k]) denom += this.value(st.layer, heads[hi], q, k);
        }
        var row = [];
        for (var ci = 0; ci < vu.cols.length; ci++) {
          var v = this.value(st.layer, heads[hi], q, vu.cols[ci]);
          row.push(st.hide_special ? (denom > 0 ? v / denom : 0) : v);
        }
        m.push(row);
      }
      out.push(m);
    }
    return { rows: vu.rows, cols: vu.cols, heads: heads, attn: out };
  };

  Viewer.prototype.setState = function (patch) {
    Object.assign(this.state, patch);
    this.focus = null;
    return this.render();
  };

  Viewer.prototype.build = function () {
    var self = this, p = this.p, root = this.root;
    root.textContent = "";
    root.classList.add("attnscope");
    var head = el("div", { "class": "as-title" }, root);
    el("strong", null, head, p.title);
    el("span", { "class": "as-sub" }, head, " " + (p.model ? p.model + " \u00b7 " : "") +
       this.L + " layers \u00d7 " + this.H + " heads \u00b7 " + this.n + " " +
       (p.key_tokens ? "decoder tokens \u2192 " + this.nk + " encoder tokens" :
        (p.level === "word" ? "words" : "tokens") + " (" + p.level + " level)"));
    if (p.generated && p.generated.indexOf(true) >= 0) {
      var ng = p.generated.filter(function (g) { return g; }).length;
      el("div", { "class": "as-generated-note" }, root, ng + " generated token" + (ng === 1 ? "" : "s") +
         " (marked in green): the model's own greedy continuation, each row the attention of its generation step");
    }
    if (p.window) {
      var w = p.window, lo = w.offset, hi = w.offset + w.size - 1;
      head.lastChild.textContent = " " + (p.model ? p.model + " \u00b7 " : "") + this.L + " layers \u00d7 " +
        this.H + " heads \u00b7 " + w.num_units + " " + (p.level === "word" ? "words" : "tokens") +
        " (" + p.level + " level)";
      var wbar = el("div", { "class": "as-window" }, root);
      el("span", { "class": "as-window-note" }, wbar, "Long input: showing query rows " + lo + "\u2013" + hi +
         " (0-indexed positions) of " + w.num_units + ", and the first token (" + this.text[0] +
         ", the sink) as row and column; lines and cells are weights on these keys only. " +
         "The model view and the distance profile cover the whole input. ");
      if (this.options.windowLoader) {
        var ol = el("label", null, wbar, "window from ");
        var oi = el("input", { type: "number", min: 0, max: w.num_units - w.size, step: 1, value: lo,
                               "class": "as-window-offset" }, ol);
        var go = el("button", { type: "button", "class": "as-window-go" }, wbar, "show");
        var move = function () {
          var o = Math.max(0, Math.min(w.num_units - w.size, Math.round(+oi.value || 0)));
          return self.options.windowLoader(o, self.state);
        };
        go.addEventListener("click", move);
        [["\u2190 earlier", -1], ["later \u2192", 1]].forEach(function (b) {
          var bt = el("button", { type: "button", "class": "as-window-step" }, wbar, b[0]);
          bt.addEventListener("click", function () { oi.value = lo + b[1] * w.size; move(); });
        });
      } else {
        el("span", { "class": "as-muted" }, wbar, "(attnscope view --offset N shows another window.)");
      }
    }
    var bar = this.bar = el("div", { "class": "as-toolbar" }, root);

    var tabs = el("span", { "class": "as-tabs" }, bar);
    this.tabButtons = {};
    ["head", "model", "heatmap", "neuron", "profile"].forEach(function (v) {
      if (v === "neuron" && !p.neuron && !self.options.neuronLoader) return;
      if (v === "profile" && !(p.profile && p.profile.buckets.length)) return;
      var b = el("button", { type: "button", "data-view": v }, tabs, v);
      b.addEventListener("click", function () { self.setState({ view: v }); });
      self.tabButtons[v] = b;
    });

    var lab = el("label", null, bar, "layer ");
    var ls = this.layerSelect = el("select", { "class": "as-layer" }, lab);
    for (var l = 0; l < this.L; l++) el("option", { value: l }, ls, this.layerName(l));
    ls.addEventListener("change", function () { self.setState({ layer: +ls.value }); });

    var hs = this.headBoxes = el("span", { "class": "as-heads" }, bar);
    el("span", null, hs, "heads ");
    this.headChecks = [];
    for (var h = 0; h < this.H; h++) {
      (function (h) {
        var lb = el("label", { "class": "as-head", style: "border-color:" + headColour(h) }, hs);
        var cb = el("input", { type: "checkbox", "data-head": h }, lb);
        el("span", null, lb, String(h + 1));
        cb.addEventListener("change", function () {
          var hsel = [];
          self.headChecks.forEach(function (c, i) { if (c.checked) hsel.push(i); });
          self.setState({ heads: hsel });
        });
        self.headChecks.push(cb);
      })(h);
    }
    var hl = this.oneHead = el("label", null, bar, "head ");
    var os = this.headSelect = el("select", { "class": "as-head-select" }, hl);
    for (h = 0; h < this.H; h++) el("option", { value: h }, os, String(h + 1));
    os.addEventListener("change", function () { self.setState({ head: +os.value }); });

    if (p.is_pair) {
      var fl = el("label", null, bar, "pairs ");
      var fs = this.filterSelect = el("select", { "class": "as-filter" }, fl);
      ["all", "A->A", "A->B", "B->A", "B->B"].forEach(function (f) { el("option", { value: f }, fs, f); });
      fs.addEventListener("change", function () { self.setState({ pair_filter: fs.value }); });
    }
    var sl = el("label", null, bar);
    var sc = this.specialCheck = el("input", { type: "checkbox", "class": "as-hide-special" }, sl);
    el("span", null, sl, " hide special tokens");
    sc.addEventListener("change", function () { self.setState({ hide_special: sc.checked }); });

    var wl = this.weightLabel = el("label", null, bar, "min weight ");
    var wi = el("input", { type: "number", min: 0, max: 1, step: 0.01, value: this.state.min_weight,
                           "class": "as-min-weight" }, wl);
    wi.addEventListener("change", function () { self.setState({ min_weight: Math.max(0, +wi.value || 0) }); });

    var png = el("button", { type: "button", "class": "as-export-png" }, bar, "PNG");
    png.addEventListener("click", function () {
      self.exportPNG(2).then(function (url) { download(url, self.fileStem() + ".png"); });
    });
    var svgb = el("button", { type: "button", "class": "as-export-svg" }, bar, "SVG");
    svgb.addEventListener("click", function () {
      var url = "data:image/svg+xml;charset=utf-8," + encodeURIComponent(self.exportSVG());
      download(url, self.fileStem() + ".svg");
    });

    this.note = el("div", { "class": "as-note" }, root);
    this.stage = el("div", { "class": "as-stage" }, root);
    this.tip = el("div", { "class": "as-tip", hidden: "" }, root);
  };

  function download(url, name) {
    var a = el("a", { href: url, download: name }, document.body);
    a.click();
    a.remove();
  }

  Viewer.prototype.fileStem = function () {
    var s = this.state;
    var which = s.view === "model" ? "model" : s.view === "head" ? "L" + this.layerName(s.layer) :
                "L" + this.layerName(s.layer) + "-H" + (s.head + 1);
    return "attnscope-" + this.p.index + "-" + s.view + "-" + which;
  };

  Viewer.prototype.syncControls = function () {
    var s = this.state, self = this;
    for (var v in this.tabButtons) this.tabButtons[v].classList.toggle("as-active", v === s.view);
    this.layerSelect.value = s.layer;
    this.headChecks.forEach(function (c, i) { c.checked = s.heads.indexOf(i) >= 0; });
    this.headSelect.value = s.head;
    this.headBoxes.hidden = s.view !== "head";
    this.oneHead.hidden = !(s.view === "heatmap" || s.view === "neuron");
    this.weightLabel.hidden = s.view !== "head";
    this.layerSelect.parentNode.hidden = s.view === "model";
    if (this.filterSelect) {
      this.filterSelect.value = s.pair_filter;
      this.filterSelect.parentNode.hidden = s.view === "model" || s.view === "neuron";
    }
    this.specialCheck.checked = s.hide_special;
    this.specialCheck.parentNode.hidden = s.view === "model" || s.view === "neuron" || s.view === "profile";
    if (this.filterSelect && s.view === "profile") this.filterSelect.parentNode.hidden = true;
    var note = "";
    if (s.hide_special && (s.view === "head" || s.view === "heatmap")) note = self.p.renorm_note + ".";
    this.note.textContent = note;
  };

  Viewer.prototype.render = function () {
    var self = this;
    this.syncControls();
    this.stage.textContent = "";
    this.tip.hidden = true;
    var s = this.state, done;
    if (s.view === "head") done = this.renderHead();
    else if (s.view === "model") done = this.renderModel();
    else if (s.view === "heatmap") done = this.renderHeatmap();
    else if (s.view === "profile") done = this.renderProfile();
    else done = this.renderNeuron();
    return Promise.resolve(done).then(function () {
      self.root.setAttribute("data-rendered-view", s.view);
      return self;
    });
  };

  // the number a page shows for layer l of the maps: the model's own (a hybrid has attention in
  // only some of its layers: a payload's layer_numbers), else l + 1
  function layerName(numbers, l) {
    return String(numbers && numbers[l] != null ? numbers[l] : l + 1);
  }

  Viewer.prototype.layerName = function (l) { return layerName(this.p.layer_numbers, l); };

  // a caption line; widens the SVG (and its white background) when the text needs it
  Viewer.prototype.caption = function (root, x, y, text) {
    var t = svg("text", { x: x, y: y, "class": "as-caption" }, root, text);
    var need = Math.ceil(x + textWidth(text) + 8), w = +root.getAttribute("width");
    if (need > w) {
      var h = root.getAttribute("height");
      root.setAttribute("width", need);
      root.setAttribute("viewBox", "0 0 " + need + " " + h);
      root.firstChild.setAttribute("width", need);
    }
    return t;
  };

  // the legend of a caption that names items after `head`, ", " between them: each name
  // underlined in its colour; part of the drawing, so the PNG and SVG carry it
  Viewer.prototype.legend = function (root, x, y, head, names, colours) {
    var g = svg("g", { "class": "as-legend" }, root), at = x + textWidth(head);
    names.forEach(function (name, k) {
      var w = textWidth(name);
      svg("line", { x1: at, y1: y + 4, x2: at + w, y2: y + 4, stroke: colours[k], "stroke-width": 4,
                    "class": "as-swatch", "data-name": name }, g);
      at += w + textWidth(", ");
    });
    return g;
  };

  // ---- head view ------------------------------------------------------------------------
  Viewer.prototype.renderHead = function () {
    var self = this, s = this.state, p = this.p;
    var M = this.currentMatrix();
    var rowH = 22, top = 44;
    var maxW = 0;
    this.text.concat(this.kx).forEach(function (t) { maxW = Math.max(maxW, textWidth(shorten(t, 24), HEAD_FONT)); });
    var colW = Math.ceil(Math.min(maxW, 240)) + 14, kt = this.kt, ks = this.ks, text = this.text, kx = this.kx;
    // the lines take what the stage leaves, between 200 and 520 px
    var gap = Math.max(200, Math.min(520, stageWidth(this.stage) - 2 * colW - 24));
    var xL = colW, xR = colW + gap, width = 2 * colW + gap + 8;
    var nr = Math.max(M.rows.length, M.cols.length), height = top + nr * rowH + 8;
    var root = svg("svg", { xmlns: SVGNS, width: width, height: height, viewBox: "0 0 " + width + " " + height,
                            "class": "as-svg as-head-view" }, this.stage);
    svg("rect", { x: 0, y: 0, width: width, height: height, fill: "#fff" }, root);
    var layer = this.layerName(s.layer);
    var names = M.heads.map(function (h) { return layer + "-" + (h + 1); });
    var head = "Layer " + layer + ", heads ";
    this.caption(root, 4, 14, head + (names.join(", ") || "(none)") +
                 (s.pair_filter !== "all" ? ", " + s.pair_filter : ""));
    this.legend(root, 4, 14, head, names, M.heads.map(headColour));
    this.caption(root, 4, 30, s.hide_special ? "special tokens hidden, rows renormalised" :
                 "lines: weight \u2265 " + s.min_weight);
    var lines = svg("g", { "class": "as-lines" }, root);
    var boxes = svg("g", { "class": "as-boxes" }, root);
    var yOf = function (i) { return top + i * rowH + rowH / 2; };
    var makeTokens = function (list, side) {
      var g = svg("g", { "class": "as-tokens as-" + side }, root);
      var texts = side === "q" ? text : kx, raw = side === "q" ? p.tokens : kt;
      var special = side === "q" ? p.special : ks;
      var generated = side === "q" || !p.key_tokens ? p.generated : null;
      list.forEach(function (u, i) {
        var t = svg("text", { x: side === "q" ? xL - 6 : xR + 6, y: yOf(i) + 5,
                              "text-anchor": side === "q" ? "end" : "start",
                              "class": "as-token" + (special[u] ? " as-special" : "") +
                                       (generated && generated[u] ? " as-generated" : ""),
                              "data-unit": u, "data-side": side }, g, shorten(texts[u], 24));
        svg("title", null, t, raw[u] + (generated && generated[u] ? " (generated)" : ""));
        t.addEventListener("mouseenter", function () { self.focus = { side: side, i: i }; drawLines(); });
        t.addEventListener("mouseleave", function () { self.focus = null; drawLines(); });
      });
    };
    makeTokens(M.rows, "q");
    makeTokens(M.cols, "k");
    var drawLines = function () {
      lines.textContent = ""; boxes.textContent = "";
      var cand = [], f = self.focus, total = 0;
      for (var hi = 0; hi < M.heads.length; hi++) {
        var m = M.attn[hi];
        for (var r = 0; r < M.rows.length; r++) {
          if (f && f.side === "q" && f.i !== r) continue;
          for (var c = 0; c < M.cols.length; c++) {
            if (f && f.side === "k" && f.i !== c) continue;
            var w = m[r][c];
            if (w > 0 && w >= s.min_weight) cand.push([w, hi, r, c]);
          }
        }
      }
      total = cand.length;
      if (cand.length > MAX_LINES) {
        cand.sort(function (a, b) { return b[0] - a[0]; });
        cand.length = MAX_LINES;
      }
      var frag = document.createDocumentFragment();
      cand.forEach(function (x) {
        frag.appendChild(svg("line", { x1: xL, y1: yOf(x[2]), x2: xR, y2: yOf(x[3]),
                                       stroke: headColour(M.heads[x[1]]), "stroke-width": 2.5,
                                       "stroke-opacity": lineOpacity(x[0]).toFixed(3) }));
      });
      lines.appendChild(frag);
      if (f) {  // weights of the focused token as boxes behind the tokens on the other side
        var list = f.side === "q" ? M.cols : M.rows, bx = f.side === "q" ? xR + 2 : 2;
        var hh = 18 / Math.max(1, M.heads.length);
        for (var hi2 = 0; hi2 < M.heads.length; hi2++) {
          for (var j = 0; j < list.length; j++) {
            var w2 = f.side === "q" ? M.attn[hi2][f.i][j] : M.attn[hi2][j][f.i];
            svg("rect", { x: bx, y: yOf(j) - 9 + hi2 * hh, width: colW - 4, height: hh,
                          fill: headColour(M.heads[hi2]), "fill-opacity": Math.min(1, w2).toFixed(3) }, boxes);
          }
        }
      }
      self.root.setAttribute("data-lines", String(cand.length));
      if (self.outside) self.root.setAttribute("data-outside", self.outsideMean(s.layer, M.heads).toFixed(4));
      self.status("head", total > MAX_LINES ? "showing the " + MAX_LINES + " strongest of " + total +
                  " lines" : cand.length + " lines");
    };
    drawLines();
  };

  // mean mass that the shown rows of `heads` put on keys outside a long input's window
  Viewer.prototype.outsideMean = function (layer, heads) {
    var m = this.n, d = this.outside.data, tot = 0;
    heads.forEach(function (h) { for (var r = 0; r < m; r++) tot += d[(layer * this.H + h) * m + r] / 255; }, this);
    return heads.length ? tot / (heads.length * m) : 0;
  };

  // ---- distance profile -----------------------------------------------------------------
  // mass per log-spaced distance bucket, one line per head of the layer (payload.distance_profile)
  Viewer.prototype.renderProfile = function () {
    var s = this.state, prof = this.p.profile, H = this.H;
    var root = svg("svg", { xmlns: SVGNS, width: 10, height: 10, "class": "as-svg as-profile-view" }, this.stage);
    var layer = this.layerName(s.layer);
    drawProfile(root, prof.buckets, prof.values[s.layer], "Layer " + layer +
                ": attention mass against distance |i \u2212 j| (mean over query rows \u2265 1, whole input)",
                function (h) { return layer + "-" + (h + 1); });
    this.status("profile", H + " heads");
  };

  // a line chart of series[k][b] over bucket labels; draws into an empty <svg> and sizes it
  // a profile chart: one line per head over the buckets; `avail` (px): the width to fill
  // (the plot grows to it, beside the legend), else about 36 px a bucket
  function drawProfile(root, buckets, series, title, name, axis, avail) {
    var B = buckets.length, left = 48, top = 40, ph = 200;
    var legend = 40 + Math.ceil(Math.max.apply(null, series.map(function (r, k) { return textWidth(name(k)); }).concat([30])));
    var pw = Math.max(240, avail ? avail - left - legend - 8 : 36 * B);
    // the slanted bucket labels reach down by their width times sin(35 degrees); the axis title goes below them
    var drop = 14 + Math.ceil(Math.max.apply(null, buckets.map(function (b) { return textWidth(String(b)); }).concat([0])) * 0.574);
    var width = Math.max(left + pw + legend, Math.ceil(textWidth(title)) + 12), height = top + ph + drop + 20;
    root.setAttribute("width", width); root.setAttribute("height", height);
    root.setAttribute("viewBox", "0 0 " + width + " " + height);
    svg("rect", { x: 0, y: 0, width: width, height: height, fill: "#fff" }, root);
    svg("text", { x: 4, y: 14, "class": "as-caption" }, root, title);
    var mx = 0;
    series.forEach(function (r) { r.forEach(function (v) { if (v !== null && v > mx) mx = v; }); });
    mx = mx > 0 ? mx : 1;
    var X = function (b) { return left + (B > 1 ? b / (B - 1) : 0.5) * pw; };
    var Y = function (v) { return top + ph - (v / mx) * ph; };
    svg("rect", { x: left, y: top, width: pw, height: ph, fill: "none", stroke: "#bbb" }, root);
    [0, 0.5, 1].forEach(function (f) {
      svg("text", { x: left - 4, y: Y(f * mx) + 4, "text-anchor": "end", "class": "as-axis" }, root, (f * mx).toFixed(2));
    });
    buckets.forEach(function (lab, b) {
      var x = X(b), y = top + ph + 14;
      svg("text", { x: x, y: y, "text-anchor": "end", transform: "rotate(-35 " + x + " " + y + ")", "class": "as-axis" }, root, lab);
    });
    svg("text", { x: left + pw / 2, y: height - 4, "text-anchor": "middle", "class": "as-axis as-x-axis" }, root,
        axis || "distance bucket (log-spaced)");
    series.forEach(function (r, k) {
      var pts = [];
      r.forEach(function (v, b) { if (v !== null) pts.push(X(b).toFixed(1) + "," + Y(v).toFixed(1)); });
      var g = svg("g", { "class": "as-profile-line", "data-series": k }, root);
      svg("polyline", { points: pts.join(" "), fill: "none", stroke: headColour(k), "stroke-width": 2 }, g);
      svg("title", null, g, name(k));
      svg("line", { x1: left + pw + 12, y1: top + 8 + k * 14, x2: left + pw + 30, y2: top + 8 + k * 14,
                    stroke: headColour(k), "stroke-width": 3 }, root);
      svg("text", { x: left + pw + 34, y: top + 12 + k * 14, "class": "as-axis" }, root, name(k));
    });
  }

  Viewer.prototype.status = function (view, text) {
    this.root.setAttribute("data-status", text);
  };

  // ---- model view -----------------------------------------------------------------------
  Viewer.prototype.renderModel = function () {
    var self = this, L = this.L, H = this.H, tq = this.thumbs.shape[2], tk = this.thumbs.shape[3];
    // every head column in the stage's width: cells of 28 to 72 px
    var left = 34, top = 34, pad = 16;
    var cell = Math.max(28, Math.min(72, Math.floor((stageWidth(this.stage) - left - 12) / H) - 6));
    var width = left + H * (cell + 6) + 4, height = top + L * (cell + pad) + 4;
    var root = svg("svg", { xmlns: SVGNS, width: width, height: height, viewBox: "0 0 " + width + " " + height,
                            "class": "as-svg as-model-view" }, this.stage);
    svg("rect", { x: 0, y: 0, width: width, height: height, fill: "#fff" }, root);
    this.caption(root, 4, 14, "Every layer (rows) and head (columns), each scaled to its own maximum; click a head to open it");
    var data = this.thumbs.data;
    for (var h = 0; h < H; h++) svg("text", { x: left + h * (cell + 6) + cell / 2, y: top - 4,
                                               "text-anchor": "middle", "class": "as-axis" }, root, String(h + 1));
    for (var l = 0; l < L; l++) {
      svg("text", { x: left - 6, y: top + l * (cell + pad) + cell / 2 + 4, "text-anchor": "end",
                    "class": "as-axis" }, root, this.layerName(l));
      for (h = 0; h < H; h++) {
        (function (l, h) {
          var base = (l * H + h) * tq * tk;
          var mx = 0;
          for (var i = 0; i < tq * tk; i++) mx = Math.max(mx, data[base + i]);
          var url = gridImage(tq, tk, function (r, k) { return mx ? data[base + r * tk + k] / mx : 0; }, blues);
          var x = left + h * (cell + 6), y = top + l * (cell + pad);
          var g = svg("g", { "class": "as-thumb", "data-layer": l, "data-head": h, cursor: "pointer" }, root);
          pixelImage(g, url, x, y, cell, cell);
          svg("rect", { x: x, y: y, width: cell, height: cell, fill: "none", stroke: "#999" }, g);
          svg("title", null, g, "head " + self.layerName(l) + "-" + (h + 1));
          g.addEventListener("click", function () {
            self.setState({ view: "head", layer: l, heads: [h], head: h });
          });
        })(l, h);
      }
    }
    this.status("model", L * H + " heads");
  };

  // ---- heatmap view ---------------------------------------------------------------------
  Viewer.prototype.renderHeatmap = function () {
    var self = this, s = this.state, p = this.p;
    var M = this.currentMatrix(), m = M.attn[0], R = M.rows.length, C = M.cols.length;
    var cell = Math.max(1, Math.min(20, Math.floor(720 / Math.max(R, C, 1))));
    var labels = cell >= 8, maxW = 0;
    var kt = this.kt, ks = this.ks, text = this.text, kx = this.kx;
    if (labels) text.concat(kx).forEach(function (t) { maxW = Math.max(maxW, textWidth(shorten(t, 16))); });
    var lm = labels ? Math.ceil(maxW) + 10 : 10, top = 56 + (labels ? Math.ceil(maxW) + 10 : 0);
    var width = lm + C * cell + 10, height = top + R * cell + 10;
    var root = svg("svg", { xmlns: SVGNS, width: width, height: height, viewBox: "0 0 " + width + " " + height,
                            "class": "as-svg as-heatmap-view" }, this.stage);
    svg("rect", { x: 0, y: 0, width: width, height: height, fill: "#fff" }, root);
    this.caption(root, 4, 14, "Head " + this.layerName(s.layer) + "-" + (s.head + 1) + ": rows attend (query), columns are attended (key)");
    this.caption(root, 4, 30, (s.hide_special ? "special tokens hidden, rows renormalised; " : "") +
                 (labels ? "" : "labels hidden at this size; hover for values"));
    var top1 = 0;
    m.forEach(function (row) { row.forEach(function (v) { top1 = Math.max(top1, v); }); });
    this.caption(root, 4, 30 + 16, "colour: white = 0, dark blue = " + top1.toFixed(3) + " (the largest weight shown)");
    var url = gridImage(R, C, function (r, k) { return top1 > 0 ? m[r][k] / top1 : 0; }, blues);
    var im = pixelImage(root, url, lm, top, C * cell, R * cell);
    svg("rect", { x: lm, y: top, width: C * cell, height: R * cell, fill: "none", stroke: "#999" }, root);
    if (labels) {
      M.rows.forEach(function (u, i) {
        var t = svg("text", { x: lm - 4, y: top + i * cell + cell / 2 + 4, "text-anchor": "end",
                              "class": "as-token" + (p.special[u] ? " as-special" : "") +
                                       (p.generated && p.generated[u] ? " as-generated" : ""),
                              "data-unit": u, "data-side": "q" }, root, shorten(text[u], 16));
        svg("title", null, t, p.tokens[u]);
      });
      M.cols.forEach(function (u, j) {
        var x = lm + j * cell + cell / 2 + 4, y = top - 4;
        var t = svg("text", { x: x, y: y, transform: "rotate(-90 " + x + " " + y + ")",
                              "class": "as-token" + (ks[u] ? " as-special" : ""),
                              "data-unit": u, "data-side": "k" }, root, shorten(kx[u], 16));
        svg("title", null, t, kt[u]);
      });
    }
    im.addEventListener("mousemove", function (ev) {
      var box = im.getBoundingClientRect();
      var r = Math.floor((ev.clientY - box.top) / box.height * R), c = Math.floor((ev.clientX - box.left) / box.width * C);
      if (r < 0 || c < 0 || r >= R || c >= C) return;
      self.showTip(ev, text[M.rows[r]] + " \u2192 " + kx[M.cols[c]] + ": " + m[r][c].toFixed(3));
    });
    im.addEventListener("mouseleave", function () { self.tip.hidden = true; });
    this.status("heatmap", R + " x " + C);
  };

  Viewer.prototype.showTip = function (ev, text) {
    var t = this.tip, box = this.root.getBoundingClientRect();
    t.textContent = text;
    t.hidden = false;
    t.style.left = (ev.clientX - box.left + 12) + "px";
    t.style.top = (ev.clientY - box.top + 12) + "px";
  };

  // ---- neuron view ----------------------------------------------------------------------
  Viewer.prototype.loadNeuron = function (layer) {
    var self = this, src;
    if (this.neuron && this.neuron.layer === layer) return Promise.resolve(this.neuron);
    if (this.options.neuronLoader) src = this.options.neuronLoader(layer);
    else if (this.p.neuron) src = Promise.resolve(this.p.neuron);
    else return Promise.reject(new Error("no neuron data in this page"));
    return src.then(function (np) {
      return Promise.all([decodeBlob(np.query), decodeBlob(np.key), decodeBlob(np.model_attn)]).then(function (b) {
        self.neuron = { meta: np, layer: np.layer, q: b[0], k: b[1], attn: b[2] };
        return self.neuron;
      });
    });
  };

  // q, k_j, q*k_j, q.k_j/sqrt(d) and softmax for one head and query (neuron.py QueryKey)
  Viewer.prototype.neuronValues = function (head, query) {
    var N = this.neuron, sh = N.q.shape, n = sh[1], d = sh[2], Q = N.q.data, K = N.k.data;
    var qv = Array.prototype.slice.call(Q, (head * n + query) * d, (head * n + query + 1) * d);
    var prods = [], dots = [], maxDot = -Infinity;
    for (var j = 0; j < n; j++) {
      var pj = [], sum = 0;
      for (var i = 0; i < d; i++) { var v = qv[i] * K[(head * n + j) * d + i]; pj.push(v); sum += v; }
      prods.push(pj);
      var masked = N.meta.causal && j > query;
      var dot = masked ? null : sum / Math.sqrt(d);
      dots.push(dot);
      if (dot !== null) maxDot = Math.max(maxDot, dot);
    }
    var z = 0, soft = dots.map(function (x) { var e = x === null ? 0 : Math.exp(x - maxDot); z += e; return e; });
    soft = soft.map(function (e) { return e / z; });
    var model = [];
    for (j = 0; j < n; j++) model.push(N.attn.data[(head * n + query) * n + j]);
    return { q: qv, prods: prods, dots: dots, softmax: soft, model: model, n: n, d: d };
  };

  Viewer.prototype.renderNeuron = function () {
    var self = this, s = this.state;
    var msg = el("div", { "class": "as-loading" }, this.stage, "loading query/key vectors\u2026");
    var want = this.options.neuronLoader ? s.layer : (this.p.neuron ? this.p.neuron.layer : s.layer);
    return this.loadNeuron(want).then(function (N) {
      msg.remove();
      if (s.layer !== N.layer) { s.layer = N.layer; self.syncControls(); }
      self.drawNeuron(N);
    }, function (err) {
      msg.textContent = "neuron view unavailable: " + (err && err.message ? err.message : err);
      msg.classList.add("as-error");
    });
  };

  Viewer.prototype.drawNeuron = function (N) {
    var self = this, s = this.state, meta = N.meta, raw = meta.tokens, toks = meta.token_text || raw;
    var query = Math.min(s.query, toks.length - 1);
    var V = this.neuronValues(s.head, query), n = V.n, d = V.d;
    var cw = Math.max(2, Math.min(8, Math.floor(320 / d))), rowH = 16, top = 70, maxW = 0;
    toks.forEach(function (t) { maxW = Math.max(maxW, textWidth(shorten(t, 20))); });
    var tokW = Math.ceil(maxW) + 12;
    var xQ = 4, xK = xQ + tokW + 16, xKv = xK + tokW + 6, xP = xKv + d * cw + 16, xDot = xP + d * cw + 16;
    var xSoft = xDot + 70, showModel = !meta.softmax_matches_model;
    var width = xSoft + 170 + (showModel ? 70 : 0), height = top + n * rowH + 10;
    var root = svg("svg", { xmlns: SVGNS, width: width, height: height, viewBox: "0 0 " + width + " " + height,
                            "class": "as-svg as-neuron-view" }, this.stage);
    svg("rect", { x: 0, y: 0, width: width, height: height, fill: "#fff" }, root);
    this.caption(root, 4, 14, "Head " + this.layerName(N.layer) + "-" + (s.head + 1) + " (" + meta.family +
                 "), query: \u201c" + toks[query] + "\u201d; click a token on the left to change it");
    if (meta.note) this.caption(root, 4, 30, meta.note);
    var maxQ = 1e-9, maxP = 1e-9, maxK = 1e-9;
    V.q.forEach(function (v) { maxQ = Math.max(maxQ, Math.abs(v)); });
    V.prods.forEach(function (r) { r.forEach(function (v) { maxP = Math.max(maxP, Math.abs(v)); }); });
    var K = N.k.data;
    for (var j = 0; j < n * d; j++) maxK = Math.max(maxK, Math.abs(K[s.head * n * d + j]));
    var hy = top - 10;
    svg("text", { x: xK, y: hy, "class": "as-axis" }, root, "key");
    svg("text", { x: xKv, y: hy, "class": "as-axis" }, root, "k");
    svg("text", { x: xP, y: hy, "class": "as-axis" }, root, "q \u00d7 k");
    svg("text", { x: xDot, y: hy, "class": "as-axis" }, root, "q\u00b7k/\u221ad");
    svg("text", { x: xSoft, y: hy, "class": "as-axis" }, root, "softmax");
    if (showModel) svg("text", { x: xSoft + 170, y: hy, "class": "as-axis" }, root, "model");
    svg("text", { x: xKv, y: 46, "class": "as-axis", "text-anchor": "end", dx: -4 }, root, "q");
    pixelImage(root, gridImage(1, d, function (r, i) { return V.q[i] / maxQ; }, diverging), xKv, 38, d * cw, 10);
    pixelImage(root, gridImage(n, d, function (r, i) { return K[(s.head * n + r) * d + i] / maxK; }, diverging),
               xKv, top, d * cw, n * rowH);
    pixelImage(root, gridImage(n, d, function (r, i) { return V.prods[r][i] / maxP; }, diverging),
               xP, top, d * cw, n * rowH);
    for (j = 0; j < n; j++) {
      (function (j) {
        var y = top + j * rowH + rowH / 2 + 4;
        var qt = svg("text", { x: xQ + tokW, y: y, "text-anchor": "end", cursor: "pointer",
                               "class": "as-token as-neuron-query" + (j === query ? " as-selected" : "") +
                               (meta.special[j] ? " as-special" : ""), "data-unit": j }, root, shorten(toks[j], 20));
        svg("title", null, qt, raw[j]);
        qt.addEventListener("click", function () { self.setState({ query: j }); });
        var kt = svg("text", { x: xK, y: y, "class": "as-token" + (meta.special[j] ? " as-special" : "") }, root, shorten(toks[j], 20));
        svg("title", null, kt, raw[j]);
        svg("text", { x: xDot, y: y, "class": "as-num" }, root, V.dots[j] === null ? "masked" : V.dots[j].toFixed(2));
        svg("rect", { x: xSoft, y: y - 10, width: Math.max(0, 100 * V.softmax[j]), height: 12, fill: headColour(s.head) }, root);
        svg("text", { x: xSoft + 106, y: y, "class": "as-num" }, root, V.softmax[j].toFixed(3));
        if (showModel) svg("text", { x: xSoft + 170, y: y, "class": "as-num" }, root, V.model[j].toFixed(3));
      })(j);
    }
    this.status("neuron", n + " keys");
  };

  // ---- export ---------------------------------------------------------------------------
  Viewer.prototype.currentSvg = function () { return this.stage.querySelector("svg"); };

  Viewer.prototype.svgSize = function () {
    var e = this.currentSvg();
    return e ? { width: +e.getAttribute("width"), height: +e.getAttribute("height") } : null;
  };

  Viewer.prototype.exportSVG = function () {
    var e = this.currentSvg();
    if (!e) throw new Error("nothing to export");
    var copy = e.cloneNode(true);
    var st = document.createElementNS(SVGNS, "style");
    st.textContent = SVG_STYLE;
    copy.insertBefore(st, copy.firstChild);
    return new XMLSerializer().serializeToString(copy);
  };

  // the current view as a PNG data URL, `scale` pixels per SVG unit
  Viewer.prototype.exportPNG = function (scale) {
    scale = scale || 1;
    var size = this.svgSize(), text = this.exportSVG();
    return new Promise(function (resolve, reject) {
      var img = new Image();
      img.onload = function () {
        var c = document.createElement("canvas");
        c.width = Math.round(size.width * scale); c.height = Math.round(size.height * scale);
        var ctx = c.getContext("2d");
        ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, c.width, c.height);
        ctx.drawImage(img, 0, 0, c.width, c.height);
        resolve(c.toDataURL("image/png"));
      };
      img.onerror = function () { reject(new Error("could not rasterise the SVG")); };
      img.src = "data:image/svg+xml;charset=utf-8," + encodeURIComponent(text);
    });
  };

  var SVG_STYLE = "text{font:12px sans-serif;fill:#222}.as-special{fill:#888;font-style:italic}" +
                  ".as-caption{font-size:12px;fill:#444}.as-axis{font-size:11px;fill:#555}" +
                  ".as-num{font:11px monospace}.as-selected{font-weight:bold;fill:#c00}" +
                  ".as-generated{fill:#1a7f37;font-weight:bold}.as-head-view text.as-token{font-size:14px}";

  // ---- public API -----------------------------------------------------------------------
  function mount(root, payload, options) {
    root.setAttribute("data-ready", "false");
    var blobs = [decodeBlob(payload.attn), decodeBlob(payload.thumbnails)];
    if (payload.window) blobs.push(decodeBlob(payload.window.outside));
    return Promise.all(blobs).then(function (b) {
      var v = new Viewer(root, payload, b[0], b[1], options, b[2]);
      return v.render();
    }).then(function (v) {
      root.setAttribute("data-ready", "true");
      global.attnscope = v;
      return v;
    }, function (err) {
      root.textContent = "attnscope: could not open this view: " + (err && err.message ? err.message : err);
      root.setAttribute("data-ready", "error");
      throw err;
    });
  }

  // an encoder-decoder page: a switch between the kinds of attention (encoder, decoder, cross),
  // each its own viewer; the view and layer carry over when switching
  function mountKinds(root, payload, options) {
    root.textContent = "";
    root.setAttribute("data-ready", "false");
    var bar = el("div", { "class": "as-kinds" }, root);
    var lab = el("label", null, bar, "attention ");
    var sel = el("select", { "class": "as-kind" }, lab);
    Object.keys(payload.kinds).forEach(function (k) { el("option", { value: k }, sel, payload.labels[k] || k); });
    var sub = el("div", null, root), current = null;
    var show = function (kind) {
      var page = payload.kinds[kind];
      if (current) {
        var s = current.state, st = Object.assign({}, page.state);
        if (s.view !== "neuron" && (s.view !== "profile" || (page.profile && page.profile.buckets.length))) st.view = s.view;
        if (s.layer < page.num_layers) st.layer = s.layer;
        page = Object.assign({}, page, { state: st });
      }
      sel.value = kind;
      root.setAttribute("data-kind", kind);
      root.setAttribute("data-ready", "false");
      sub.removeAttribute("data-ready");
      return mount(sub, page, options).then(function (v) {
        current = v;
        root.setAttribute("data-ready", "true");
        return v;
      });
    };
    sel.addEventListener("change", function () { show(sel.value); });
    return show(payload.kind);
  }

  global.AttnScope = { mount: mount, mountKinds: mountKinds, decodeBlob: decodeBlob, headColour: headColour, el: el, svg: svg,
                       drawProfile: drawProfile, stageWidth: stageWidth, gridImage: gridImage, blues: blues, pixelImage: pixelImage,
                       shorten: shorten, textWidth: textWidth, layerName: layerName, SVGNS: SVGNS };
})(window);
