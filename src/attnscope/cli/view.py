"""``attnscope view``: one stored example as a self-contained HTML view (and PNG/SVG)."""

from __future__ import annotations

from enum import Enum
from pathlib import Path

import typer

from attnscope.cli.common import check_writable, console
from attnscope.cli.options import (
    HEAD_HELP,
    LAYER_HELP,
    LONG_HELP,
    LONG_MAX_SEQ_LEN_HELP,
    QUERIES_HELP,
    long_document,
    max_seq_len_option,
)
from attnscope.cli.output import results
from attnscope.data.records import layer_numbering, layer_of_number
from attnscope.errors import AttnscopeError, IndexRangeError
from attnscope.views import stored_layers, write_head_page, write_view
from attnscope.viz.export import find_chromium


class ViewKind(str, Enum):
    head = "head"
    model = "model"
    heatmap = "heatmap"
    neuron = "neuron"
    profile = "profile"
    results = "results"


class Kind(str, Enum):
    encoder = "encoder"
    decoder = "decoder"
    cross = "cross"


class PairFilter(str, Enum):
    all = "all"
    aa = "A->A"
    ab = "A->B"
    ba = "B->A"
    bb = "B->B"


def _parse_heads(text: str | None) -> list[int] | None:
    """``--heads 1,4`` (1-indexed, as the pages number heads) as 0-indexed heads ``[0, 3]``."""
    if text is None:
        return None
    try:
        heads = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise AttnscopeError(f"--heads: expected comma-separated head numbers, got {text!r}") from None
    if any(h < 1 for h in heads):
        raise AttnscopeError(f"--heads {text}: heads are numbered from 1, as the pages show them")
    return [h - 1 for h in heads]


def _layer_index(store: Path | None, layer: int) -> int:
    """``--layer`` (the model's own layer, from 1, as the pages name it) as the array layer of the
    store's maps: a hybrid's store holds only its layers with attention."""
    own = stored_layers(store) if store is not None else None
    if own is not None and own == tuple(range(len(own))):
        own = None  # every layer has attention: the page's range check names the layers
    with layer_numbering(own):
        try:
            index = layer_of_number(layer)
        except ValueError as err:
            raise AttnscopeError(f"--layer {layer}: {str(err).removeprefix(f'layer {layer} ')}",
                                 params=("layer",)) from None
    if own is not None and not 0 <= index < len(own):
        raise AttnscopeError(f"--layer {layer}: out of range (the model's layers with attention are "
                             f"{', '.join(str(i + 1) for i in own)})", params=("layer",))
    return index


def register(app: typer.Typer, analyze_app: typer.Typer) -> None:
    @app.command("view")
    def view_cli(
        store: Path = typer.Argument(None, help="Store folder (attnscope extract), or an analysis "
                                                "output folder (attnscope analyze attribution / longctx) "
                                                "for its attribution maps and profiles. Optional "
                                                "with --generate, --model and --prompt."),
        example: int = typer.Option(0, "--example", "-e", rich_help_panel="What to draw", help="Input index of the example."),
        view: ViewKind = typer.Option(ViewKind.head, "--view", rich_help_panel="What to draw", help="Which view opens first."),
        out: Path = typer.Option(..., "--out", "-o", help="HTML file to write."),
        layer: int = typer.Option(1, "--layer", rich_help_panel="What to draw", min=1, help=LAYER_HELP),
        heads: str = typer.Option(None, "--heads", rich_help_panel="What to draw", help="Head view: heads, 1-indexed as the pages "
                                                        "show them, e.g. 1,4 (default: the three that point at words most "
                                                        "sharply in that layer; the page's head boxes add others)."),
        head: int = typer.Option(None, "--head", rich_help_panel="What to draw", min=1, help=HEAD_HELP),
        query: int = typer.Option(0, "--query", rich_help_panel="What to draw", help="Neuron view: the query token position "
                                                     "(0-indexed, the first token is 0)."),
        pair_filter: PairFilter = typer.Option(PairFilter.all, "--pair-filter", rich_help_panel="What to draw",
                                               help="Sentence pairs: which segment attends to which."),
        hide_special: bool = typer.Option(False, "--hide-special", rich_help_panel="What to draw",
                                          help="Hide special tokens and renormalise rows."),
        model: str = typer.Option(None, "--model", "-m", rich_help_panel="Running the model",
                                  help="Neuron view: model to run (default: the store's)."),
        png: Path = typer.Option(None, "--png", rich_help_panel="PNG and SVG", help="Also export the view as PNG (headless Chromium)."),
        svg: Path = typer.Option(None, "--svg", rich_help_panel="PNG and SVG", help="Also export the view as SVG (headless Chromium)."),
        scale: float = typer.Option(2.0, "--scale", rich_help_panel="PNG and SVG", help="PNG pixels per SVG unit."),
        chromium: str = typer.Option(None, "--chromium", rich_help_panel="PNG and SVG", help="Chromium binary (default /usr/bin/chromium)."),
        offset: int = typer.Option(None, "--offset", rich_help_panel="Long inputs", help="Long inputs (more than --long-input units): "
                                   "first query row of the window shown (default: the last --window rows)."),
        window: int = typer.Option(256, "--window", rich_help_panel="Long inputs", min=1, help="Long inputs: query rows shown."),
        long_input: int = typer.Option(512, "--long-input", rich_help_panel="Long inputs", min=1,
                                       help="Inputs with more units than this are shown as a window."),
        kind: Kind = typer.Option(None, "--kind", rich_help_panel="What to draw", help="Encoder-decoder models: the attention the "
                                  "page opens on (encoder, decoder, cross; it switches between them)."),
        generate: int = typer.Option(None, "--generate", rich_help_panel="Running the model", min=1,
                                     help="Continue the text greedily by up to N tokens with the "
                                          "model (--model, default the store's) and show prompt and "
                                          "continuation, the generated tokens marked."),
        prompt: str = typer.Option(None, "--prompt", rich_help_panel="Running the model", help="With --generate: the text the model "
                                                          "continues (default: the stored example's)."),
        head_page: str = typer.Option(None, "--head-page", rich_help_panel="Head pages and long documents", help="With an output folder (attnscope run "
                                      "/ analyze general): the page of one head, named as the pages "
                                      "name heads (layer-head from 1, e.g. 5-3): its statistics, "
                                      "labels and top examples; each example's full head view is "
                                      "written beside it in OUT_examples/."),
        long: Path = typer.Option(None, "--long", help=LONG_HELP, rich_help_panel="Head pages and long documents"),
        queries: str = typer.Option(None, "--queries", help=QUERIES_HELP,
                                    rich_help_panel="Head pages and long documents"),
        max_seq_len: int = max_seq_len_option(16384, help=LONG_MAX_SEQ_LEN_HELP,
                                              panel="Head pages and long documents"),
    ) -> None:
        """Write a self-contained HTML view of one stored example (no CDN, works offline)."""
        if chromium is not None:  # before any model loads, with or without --png
            find_chromium(chromium)
        for path, option in ((out, "--out"), (png, "--png"), (svg, "--svg")):
            if path is not None:
                check_writable(path, folder=False, option=option)
        if long is not None:
            res = long_document(long, model=model, layer=layer, head=head, queries=queries,
                                max_seq_len=max_seq_len).write(out)
            results.print(f"{res['html']}: head {layer}-{head} over {res['tokens']:,} tokens, "
                          f"{res['bytes']:,} bytes (forward pass {res['seconds']['forward']:.1f} s)")
            return
        if head_page is not None:
            if store is None:
                raise AttnscopeError("--head-page needs the output folder of a run as STORE")
            res = write_head_page(store, head_page, out, model=model)
            for note in res["notes"]:
                console.print(note)
            results.print(f"{res['html']}: head {head_page}, {res['bytes']:,} bytes, "
                          f"{res['examples']} example head views")
            return
        try:  # the library counts layers and heads from 0 (layers with attention), the flags from 1
            res = write_view(store, example, view.value, out, layer=_layer_index(store, layer),
                             heads=_parse_heads(heads),
                             head=None if head is None else head - 1, query=query,
                             pair_filter=pair_filter.value, hide_special=hide_special, model=model,
                             png=png, svg=svg, scale=scale, chromium=chromium, offset=offset,
                             window=window, long_input=long_input, kind=kind.value if kind else None,
                             generate=generate, prompt=prompt)
        except IndexRangeError as exc:
            flag = "--layer" if exc.what == "layer" else "--head" if head is not None else "--heads"
            raise AttnscopeError(exc.one_indexed(flag)) from None
        for w in res["warnings"]:
            console.print(f"[yellow]warning:[/] {w}")
        results.print(f"{res['html']}: {res.get('view', view.value)} view, {res['bytes']:,} bytes")
        for key in ("png", "svg"):
            if res[key]:
                w, h = res[f"{key}_size"]
                results.print(f"{res[key]}: {w} x {h}")
