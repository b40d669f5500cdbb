"""The ``view`` job: one example of a store, a model's continuation of a prompt, or the results
of an analysis output folder, to view files (HTML, and optionally PNG/SVG of the opening view).

This is the library side of ``attnscope view``; it returns what it wrote. Nothing is written
unless everything succeeded: exports run first into a temporary folder. The results views ask
each registered family what it shows (:func:`family_views`), so this module sits above the
families; :mod:`attnscope.viz` only draws the plain dicts it is given.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np

from attnscope.analyses.family_result import FamilyResult
from attnscope.data.io import atomic_write_bytes, atomic_write_text
from attnscope.data.records import Example, HeadId, layer_numbering, numbers_of, recorded_layers
from attnscope.data.unlabeled import prepare_documents
from attnscope.engines.document import DocumentRows, row_summary
from attnscope.errors import AttnscopeError
from attnscope.families import FAMILIES, load_families
from attnscope.maps import AttentionMap, token_word_ids
from attnscope.models import capture, load_model
from attnscope.models.loaded import display_name
from attnscope.models.pieces import piece_texts, readable, visible
from attnscope.store import open_store
from attnscope.store.format import MANIFEST
from attnscope.store.results import HEADS_DIR, RESULTS_DIR, ResultsFolder, read_json
from attnscope.viz.export import export_html
from attnscope.viz.generate import model_maps
from attnscope.viz.head_page import head_page_payload
from attnscope.viz.long_page import long_head_payload, long_page_payload
from attnscope.viz.neuron import capture_qk, neuron_payload
from attnscope.viz.pages import head_view_html, maps_html
from attnscope.viz.render import render_head_page, render_long_page, render_results_page


def stored_layers(path: str | Path) -> tuple[int, ...] | None:
    """The model's own index of each layer a store's maps hold (a hybrid's layers with
    attention), from its manifest; None for a store of every layer, or a folder that is not a
    store (its own reader names what is wrong with it)."""
    manifest = read_json(Path(path) / MANIFEST) if Path(path).is_dir() else None
    return recorded_layers(manifest.get("model")) if isinstance(manifest, dict) else None


def load_example(store, example: int):
    """The map of input example ``example`` from an open store, with a one-line error if absent."""
    try:
        return store.by_index(example)
    except KeyError:
        idx = store.indices()
        span = f"{idx[0]}..{idx[-1]}" if idx else "none"
        raise AttnscopeError(f"{store.path}: example {example} is not in the store "
                             f"(stored examples: {span}, {len(idx)} in all)") from None


def model_for_store(store, model: str | None = None):
    """Load the model that made ``store`` (or ``model``), for the neuron view.

    Returns ``(LoadedModel, warnings)``; a weights hash that differs from the manifest's is a
    warning (the vectors may not match the stored maps).
    """
    info = store.manifest.get("model", {})
    name = model or info.get("name")
    if not name:
        raise AttnscopeError(f"{store.path}: its manifest does not name the weights; pass model",
                             params=("model",))
    lm = load_model(name, seed=store.manifest.get("seed") or 0)
    warnings = []
    want = info.get("weights_sha256")
    if want and lm.weights_hash != want and want != "unknown":
        warnings.append(f"model {name}: its weights differ from the ones that made {store.path}")
    return lm, warnings


def write_view(store_path: str | Path, example: int, view: str, out: str | Path, *,
               layer: int = 0, heads=None, head: int | None = None, query: int = 0,
               pair_filter: str = "all", hide_special: bool = False, model: str | None = None,
               png: str | Path | None = None, svg: str | Path | None = None, scale: float = 2.0,
               chromium: str | None = None, offset: int | None = None, window: int = 256,
               long_input: int = 512, kind: str | None = None, generate: int | None = None,
               prompt: str | None = None) -> dict:
    """Write ``out`` (HTML) for one stored example; ``png``/``svg`` export the opening view.

    ``store_path`` may also be an analysis output folder (no ``manifest.json``; ``view``
    "results"): then the page shows its attribution maps and long-context profiles.
    An encoder-decoder store's page switches between its kinds of attention, opening on
    ``kind`` (default "encoder"). ``generate``: the model (``model``, default the store's) reads
    ``prompt`` (default the stored example's text) and continues it greedily by up to ``generate``
    tokens; the page spans prompt and continuation (``store_path`` may then be None).
    Returns ``{"html", "png", "svg", "png_size", "svg_size", "bytes", "warnings"}``.
    """
    if generate is not None:
        return _write_generated(store_path, example, view, out, generate=generate, prompt=prompt,
                                model=model, kind=kind, layer=layer, heads=heads, head=head,
                                pair_filter=pair_filter, hide_special=hide_special, png=png, svg=svg,
                                scale=scale, chromium=chromium, offset=offset, window=window,
                                long_input=long_input)
    if store_path is None:
        raise AttnscopeError("give a store folder (or generate with a model and a prompt)",
                             params=("store",))
    if prompt is not None:
        raise AttnscopeError("prompt is only for generate (a stored example has its own text)",
                             params=("prompt", "generate"))
    if view == "results" or (Path(store_path).is_dir() and not (Path(store_path) / MANIFEST).exists()
                             and (Path(store_path) / RESULTS_DIR).is_dir()):
        if png is not None or svg is not None:
            raise AttnscopeError(f"png and svg exports: {store_path} is an analysis output folder; its "
                                 "figures are already in its figures/ folder as PNG and SVG",
                                 params=("png", "svg"))
        html = results_view_html(store_path, title=f"{Path(store_path).name}: results")
        return {**_finish(html, out, None, None, scale, chromium, []), "view": "results"}
    store = open_store(store_path)
    amap = load_example(store, example)
    if kind is not None and not store.kinds:
        raise AttnscopeError(f"kind {kind}: {store_path} is not an encoder-decoder store",
                             params=("kind",))
    warnings: list[str] = []
    neuron = None
    model_name = display_name(store.manifest.get("model"))
    if view == "neuron":
        lm, warnings = model_for_store(store, model)
        qk = capture_qk(lm, amap.example, layer, index=amap.index)
        neuron = neuron_payload(qk, head=head if head is not None else 0, query=query)
        model_name = lm.display_name
    # an encoder-decoder store: the other kinds beside the map already read (the encoder's)
    maps = {k: amap if k == store.kind else load_example(open_store(store_path, k), example)
            for k in store.kinds} or amap
    html = maps_html(maps, view, kind=kind, layer=layer, heads=heads, head=head,
                     pair_filter=pair_filter, hide_special=hide_special, neuron=neuron,
                     model=model_name, title=f"{Path(store_path).name}: example {amap.index}",
                     offset=offset, window=window, long_input=long_input)
    return _finish(html, out, png, svg, scale, chromium, warnings)


def _write_generated(store_path, example: int, view: str, out, *, generate: int, prompt, model, kind,
                     png, svg, scale, chromium, **page) -> dict:
    """``write_view`` with ``generate``: the model reads the prompt and continues it."""
    if view in ("neuron", "results"):
        raise AttnscopeError(f"view {view}: not with generate (head, model, heatmap or profile)",
                             params=("view", "generate"))
    warnings: list[str] = []
    if store_path is not None:
        store = open_store(store_path)
        stored = load_example(store, example)
        if prompt is None:
            prompt = stored.example.text
            if prompt is None:
                raise AttnscopeError(f"{store_path}: example {example} has no text to continue; "
                                     "give prompt", params=("prompt",))
        if model is None:
            lm, warnings = model_for_store(store, None)
        else:
            lm = load_model(model)
    else:
        if model is None or prompt is None:
            raise AttnscopeError("generate needs a model and a prompt (or a store to take them from)",
                                 params=("model", "prompt"))
        lm = load_model(model)
    maps = model_maps(lm, prompt, generate=generate, long_input=page["long_input"],
                      window=page["window"], offset=page["offset"])
    html = maps_html(maps, view, kind=kind, model=lm.display_name,
                     title=f"{lm.name}: continued by {generate} tokens", **page)
    return {**_finish(html, out, png, svg, scale, chromium, warnings), "view": view}


def _finish(html: str, out, png, svg, scale, chromium, warnings) -> dict:
    result = {"html": str(out), "png": None, "svg": None, "bytes": len(html.encode("utf-8")),
              "warnings": warnings}
    with tempfile.TemporaryDirectory(prefix="attnscope-export-") as tmp:
        if png is not None or svg is not None:
            tpng = Path(tmp) / "view.png" if png is not None else None
            tsvg = Path(tmp) / "view.svg" if svg is not None else None
            sizes = export_html(html, png=tpng, svg=tsvg, scale=scale, chromium=chromium)
            for src, dst, key in ((tpng, png, "png"), (tsvg, svg, "svg")):
                if src is not None:
                    _move_atomic(src, Path(dst))
                    result[key] = str(dst)
                    result[f"{key}_size"] = sizes[key]

        atomic_write_text(Path(out), html)
    return result


def _move_atomic(src: Path, dst: Path) -> None:
    atomic_write_bytes(dst, src.read_bytes())
    src.unlink()


# ---------------------------------------------------------------------------------------------
# The results views of an analysis output folder


def results_view_html(folder, *, title: str | None = None) -> str:
    """The results views of an analysis output folder (``attnscope analyze attribution`` /
    ``longctx``): one example's attribution maps side by side, per-head distance and position
    profiles, the sink-mass heatmap. Raises when the folder has none of them."""
    payload = results_payload(folder)
    if not (payload["attribution"] or payload["profiles"] or payload["sinks"]):
        why = "; ".join(payload["problems"]) or "no results/attribution.json example or long-context arrays"
        raise AttnscopeError(f"{folder}: nothing to view ({why})")
    return render_results_page(payload, title)


def family_views(found) -> list[tuple[FamilyResult, dict]]:
    """``(result, panels)`` for every results file of ``found`` (a
    :class:`~attnscope.store.results.ResultsFolder`, read by :meth:`FamilyResult.read_all
    <attnscope.analyses.family_result.FamilyResult.read_all>`): ``panels`` is what the family's
    :meth:`~attnscope.families.base.Family.view` declares (none where the family is not
    registered); malformed parts are added to ``found.problems``."""
    load_families()
    out = []
    for r in FamilyResult.read_all(found):
        family = FAMILIES.get(r.family)
        out.append((r, family().view(r, r.source, found.problems) if family is not None else {}))
    return out


def results_payload(folder: str | Path) -> dict:
    """What the results views show from an analysis output folder:
    ``{"folder", "profiles", "sinks", "attribution", "problems"}`` (empty lists / None when the
    folder holds no such results). Each family's results file (read through
    :class:`~attnscope.store.results.ResultsFolder`) fills the panels its family's
    :meth:`~attnscope.families.base.Family.view` declares."""
    folder = Path(folder)
    out: dict = {"folder": folder.name, "title": f"Results in {folder.name}", "profiles": [], "sinks": [],
                 "attribution": None, "problems": []}
    model = None
    if not folder.is_dir():
        out["problems"].append(f"{folder.name}: no such results folder")
        return out
    found = ResultsFolder(folder)
    shown = []
    for r, panels in family_views(found):
        model = model or r.model
        if any(panels.get(k) for k in ("profiles", "sinks", "attribution")):
            shown.append(FAMILIES[r.family].title)
        out["profiles"] += panels.get("profiles", [])
        out["sinks"] += panels.get("sinks", [])
        if out["attribution"] is None:
            out["attribution"] = panels.get("attribution")
    out["problems"] = found.problems  # a file that cannot be read, or a malformed part, is named
    own = recorded_layers(model) if isinstance(model, dict) else None  # a hybrid's attention layers
    out["layer_numbers"] = numbers_of(own)
    if shown:  # what the page is: the families, the model, the folder
        name = f" of {display_name(model)}" if isinstance(model, dict) else ""
        out["title"] = f"{' and '.join(shown)}{name} ({folder.name})"
    return out


# -- head pages ---------------------------------------------------------------------------------
#: Most full head views a head page links (each is a page of its own, a few hundred kB).
MAX_EXAMPLE_PAGES = 40


def head_page(folder: str | Path, name: str, *, model: str | None = None, example_pages: bool = True):
    """:func:`_head_page`, its heads named by the layers with attention the results record."""
    general = FamilyResult.read(folder, "general")
    with layer_numbering(general.layers if general is not None else None):
        return _head_page(folder, name, model=model, example_pages=example_pages)


def _head_page(folder: str | Path, name: str, *, model: str | None = None, example_pages: bool = True):
    """``(payload, pages)``: what the page of head ``name`` (``"5-3"``, 1-indexed) shows from the
    output folder ``folder`` (:func:`attnscope.viz.head_page.head_page_payload`), and, when
    ``example_pages`` and the model that made the results (or ``model``) loads, the full head
    view of every example the page names, ``{index: html}``. The views are drawn from one
    forward pass over the example's own tokens, the pass the run made."""
    folder = Path(folder)
    found = ResultsFolder(folder)
    results = {r.family: r for r in FamilyResult.read_all(found)}
    general = results.get("general")
    if general is None:
        raise AttnscopeError(f"{folder}: no results/general.json; a head page shows what the general "
                             "family measured (attnscope run or attnscope analyze general)")
    rows = general.tables.get("general_heads") or []
    L, H = 1 + max((r["layer"] for r in rows), default=-1), 1 + max((r["head"] for r in rows), default=-1)
    try:
        hid = HeadId.parse(name)
    except ValueError as err:
        why = str(err) if "attention" in str(err) else "name a head as the pages do, layer-head from 1 (e.g. 5-3)"
        raise AttnscopeError(f"head_page {name!r}: {why}", params=("head_page",)) from None
    if not (0 <= hid.layer < L and 0 <= hid.head < H):
        raise AttnscopeError(f"head_page {name}: {folder.name}'s model has {L} layers of {H} heads "
                             f"({HeadId(0, 0)} to {HeadId(L - 1, H - 1)})", params=("head_page",))
    path = folder / HEADS_DIR / "general.json"
    examples = read_json(path)
    if path.exists() and not (isinstance(examples, dict) and isinstance(examples.get("heads"), dict)
                              and isinstance(examples.get("examples"), dict)):
        raise AttnscopeError(f"{path}: not a head-examples file (corrupt or cut short); run the "
                             "general family again to rewrite it")
    notes = list(found.problems)  # (a malformed part of a results file, left out)
    if examples is None:
        notes.append("No top examples: the general family kept none (the streaming engine "
                     "computes no maps to draw them from) or this folder predates them.")
    payload = head_page_payload(results, examples, name, folder=folder.name, notes=notes)
    pages: dict[int, str] = {}
    if examples and example_pages:
        pages = _example_views(examples, payload, hid, model, notes)
    return payload, pages


def _example_views(examples: dict, payload: dict, hid: HeadId, model: str | None,
                   notes: list[str]) -> dict[int, str]:
    wanted = sorted({int(i) for i in payload["units"]})
    info = examples.get("model") or {}
    name = model or info.get("name")
    try:
        lm = load_model(name)
    except AttnscopeError as exc:
        notes.append(f"The strips do not open full head views: the model {name} did not load ({exc}).")
        return {}
    if info.get("weights_sha256") not in (None, "unknown", lm.weights_hash):
        notes.append(f"The full head views come from {name}, whose weights differ from the run's.")
    if len(wanted) > MAX_EXAMPLE_PAGES:
        notes.append(f"Full head views for the first {MAX_EXAMPLE_PAGES} of the {len(wanted)} "
                     "examples named (by input position).")
    pages = {}
    for index in wanted[:MAX_EXAMPLE_PAGES]:
        units = examples["examples"][str(index)]
        special = np.asarray(units["special"], bool)
        ids = lm.tokenizer.convert_tokens_to_ids(units["tokens"])
        attn = capture.attention(lm, ids, token_type_ids=units["segment"])
        amap = AttentionMap(index=index, attn=attn, tokens=list(units["tokens"]), special=special,
                            segment=np.asarray(units["segment"]), word_ids=token_word_ids(special),
                            level=units.get("level", "token"), example=Example(tokens=list(units["tokens"])),
                            token_text=units.get("text"))
        pages[index] = head_view_html(amap, layer=hid.layer, heads=[hid.head],
                                      title=f"Head {hid}, example {index}", model=display_name(info) if info else None)
    return pages


def head_page_html(folder: str | Path, name: str) -> str:
    """The page of head ``name`` alone (no full head views; see :func:`write_head_page`)."""
    payload, _ = head_page(folder, name, example_pages=False)
    return render_head_page(payload)


def write_head_page(folder: str | Path, name: str, out: str | Path, *, model: str | None = None) -> dict:
    """Write the page of head ``name`` to ``out`` and, beside it in ``<out stem>_examples/``,
    the full head view of each example it names (clicking a strip opens it). Returns what it
    wrote: ``{"html", "bytes", "examples", "notes"}``."""
    out = Path(out)
    payload, pages = head_page(folder, name, model=model)
    side = out.parent / f"{out.stem}_examples"
    links = {}
    for index, html in pages.items():
        path = side / f"example-{index}.html"
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, html)
        links[str(index)] = f"{side.name}/{path.name}"
    payload["pages"] = links
    html = render_head_page(payload)
    atomic_write_text(out, html)
    return {"html": str(out), "bytes": len(html.encode("utf-8")), "examples": len(links),
            "notes": payload["notes"]}


# -- long documents -----------------------------------------------------------------------------
class LongDocumentView:
    """A long document read once (the first of ``path``, up to ``max_seq_len`` tokens;
    consecutive documents joined until then, as ``analyze longctx --join``): the page of head
    ``(layer, head)`` (0-indexed; :func:`attnscope.viz.long_page.long_page_payload`) with the rows
    of ``queries`` (default: the last token), and on demand any other row (:meth:`row`, what the
    viewer answers a click with) or head (:meth:`head`, what it answers another head picked with).
    The head and the queries are checked before the model runs."""

    def __init__(self, path: str | Path, *, model: str, layer: int, head: int,
                 queries: list[int] | None = None, max_seq_len: int = 16384):
        import time

        lm = self.lm = load_model(model)
        L, H = lm.num_layers, lm.num_heads
        self._check_head(layer, head)
        document = prepare_documents(path, lm.tokenizer, max_seq_len=max_seq_len, join=True, num_docs=1)[0]
        ids, n = document.ids, len(document.ids)
        queries = [n - 1] if not queries else list(queries)
        bad = [q for q in queries if not 0 <= q < n]
        if bad:
            raise AttnscopeError(f"queries {', '.join(map(str, bad))}: the document has {n} tokens "
                                 f"(0 to {n - 1})", params=("queries",))
        start = time.perf_counter()
        self.doc = DocumentRows(ids, *capture.document_queries_keys(lm, ids), causal=lm.facts.causal)
        seconds = {"forward": time.perf_counter() - start}
        rows = [self.row(layer, head, q) for q in queries]
        start = time.perf_counter()
        profiles = self.doc.profiles(layer, head)
        seconds["profiles"] = time.perf_counter() - start
        self.queries = queries
        tokens = lm.tokenizer.convert_ids_to_tokens(list(ids))
        specials = set(lm.tokenizer.all_special_tokens)
        special = [t in specials for t in tokens]
        labels = [visible(t) for t in readable(tokens, special, piece_texts(lm.tokenizer, tokens, special), "token")]
        self.payload = long_page_payload(labels=labels, raw=list(tokens), layer=layer, head=head, rows=rows,
                                         profiles=profiles, model=lm.display_name, source=document.source,
                                         num_layers=L, num_heads=H, seconds=seconds,
                                         layer_numbers=numbers_of(lm.facts.attention_layers))

    def _check_head(self, layer: int, head: int) -> None:
        L, H = self.lm.num_layers, self.lm.num_heads
        if not (0 <= layer < L and 0 <= head < H):
            raise AttnscopeError(f"head {HeadId(layer, head)}: {self.lm.display_name} has {L} layers of {H} "
                                 f"heads ({HeadId(0, 0)} to {HeadId(L - 1, H - 1)})", params=("layer", "head"))

    def html(self, served: bool = False) -> str:
        """The page; ``served``: by the viewer, which computes the row of any token clicked and
        the profiles and rows of any other head picked."""
        payload = ({**self.payload, "api": "/api/long/row", "head_api": "/api/long/head"} if served
                   else self.payload)
        return render_long_page(payload, served=served)

    def head(self, layer: int, head: int, queries: list[int] | None = None) -> dict:
        """The page's part for head ``(layer, head)`` (0-indexed): its profiles and its rows at
        ``queries`` (default: the page's), from the same forward pass (every row of the head:
        ``O(n^2 d)``, no ``[n n]`` map held)."""
        queries = self.queries if queries is None else list(queries)
        rows = [self.row(layer, head, q) for q in queries]  # the head and each query checked
        return long_head_payload(layer=layer, head=head, n=self.doc.n, rows=rows,
                            profiles=self.doc.profiles(layer, head), model=self.lm.display_name)

    def row(self, layer: int, head: int, query: int) -> dict:
        """The :func:`~attnscope.engines.document.row_summary` of one head's row at ``query``."""
        self._check_head(layer, head)
        return row_summary(self.doc.row(layer, head, query), query)

    def write(self, out: str | Path) -> dict:
        """Write the page to ``out``; returns ``{"html", "bytes", "tokens", "seconds"}``."""
        html = self.html()
        atomic_write_text(Path(out), html)
        return {"html": str(out), "bytes": len(html.encode("utf-8")), "tokens": self.doc.n,
                "seconds": self.payload["seconds"]}
