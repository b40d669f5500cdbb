"""Figures whose text collides: every visible text of a figure (titles, axis labels, tick labels,
colour-bar labels, offset text) measured by matplotlib's renderer, none overlapping another and
none outside the figure."""

from __future__ import annotations

import itertools

import pytest


def text_collisions(fig) -> list[str]:
    """Pairs of visible, non-empty texts whose window extents overlap (by more than one pixel
    each way), and texts that reach outside the figure."""
    from matplotlib.text import Text

    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    boxes = []
    for t in fig.findobj(Text):
        if t.get_visible() and t.get_text().strip() and (t.axes is None or t.axes.get_visible()):
            boxes.append((t.get_text(), t.get_window_extent(renderer)))
    out = []
    W, H = fig.bbox.width, fig.bbox.height
    for text, b in boxes:
        if b.x0 < -1 or b.y0 < -1 or b.x1 > W + 1 or b.y1 > H + 1:
            out.append(f"{text!r} outside the figure ({b.x0:.0f}, {b.y0:.0f}, {b.x1:.0f}, {b.y1:.0f} in {W:.0f} x {H:.0f})")
    for (ta, a), (tb, b) in itertools.combinations(boxes, 2):
        if min(a.x1, b.x1) - max(a.x0, b.x0) > 1 and min(a.y1, b.y1) - max(a.y0, b.y0) > 1:
            out.append(f"{ta!r} overlaps {tb!r}")
    return out


@pytest.fixture
def figures(monkeypatch):
    """The figures the report code saves, by file stem, checked before they are closed."""
    import attnscope.report.figures as F

    found = {}
    save = F.save_figure

    def keep(fig, stem, *a, **k):
        found[str(stem).rsplit("/", 1)[-1]] = text_collisions(fig)
        return save(fig, stem, *a, **k)

    for mod in ("attnscope.compare.report", "attnscope.report.figures", "attnscope.report.attribution",
                "attnscope.report.general"):
        monkeypatch.setattr(f"{mod}.save_figure", keep)
    return found


def _bert_12_heads(tokenizer, seed: int):
    import torch
    import transformers


    torch.manual_seed(seed)
    config = transformers.BertConfig(vocab_size=len(tokenizer), hidden_size=48, num_hidden_layers=3,
                                     num_attention_heads=12, intermediate_size=64,
                                     max_position_embeddings=512, type_vocab_size=2)
    return transformers.BertModel(config)


@pytest.mark.heavy
def test_compare_head_changes_has_no_colliding_text(tmp_path, debug_bert, figures):
    """Two random 3-layer x 12-head models (the tick labels of 12 heads, ten colour bars)."""
    from attnscope.compare import compare
    from attnscope.data.records import Example
    from attnscope.extract.runner import ExtractOptions
    from attnscope.jobs import extract_to_store
    from attnscope.models import load_model

    stores = []
    for seed in (0, 1):
        folder = tmp_path / f"bert-{seed}"
        _bert_12_heads(debug_bert.tokenizer, seed).save_pretrained(folder)
        debug_bert.tokenizer.save_pretrained(folder)
        stores.append(tmp_path / f"s{seed}")
        extract_to_store([Example(words=["the", "cat", "sat", "on", "the", "mat", "."]),
                          Example(words=["a", "dog", "ran", "."])], stores[-1], load_model(str(folder)),
                         options=ExtractOptions())
    compare(stores[0], stores[1], tmp_path / "out", n_boot=100)
    assert figures["compare_head_changes"] == []
    assert figures["compare_layers"] == [] and figures["compare_distances"] == []


@pytest.mark.heavy
def test_the_attribution_example_has_axis_titles_token_labels_and_colour_bars(tmp_path, figures):
    """It had none of them, and more than 48 tokens lost every label: 60 tokens, every other one
    labelled, five panels, each with a colour bar, and no text colliding."""
    import numpy as np

    from attnscope.report.attribution import _example_figure
    from attnscope.report.section import Section

    n, L = 60, 2
    rng = np.random.default_rng(0)
    maps = rng.random((L, n, n))
    maps /= maps.sum(-1, keepdims=True)
    ex = {"index": 3, "tokens": ["[CLS]"] + [f"word{i}" for i in range(n - 2)] + ["[SEP]"],
          "rollout": maps[0], "flow": maps[1], "weights": maps, "norms": maps, "value_zeroing": maps}
    sec = Section(key="attribution", title="t")
    _example_figure(sec, ex, tmp_path)
    assert figures["attribution_example"] == []
    import matplotlib.pyplot as plt

    from attnscope.report import attribution

    fig = plt.figure()
    ax = fig.add_subplot()
    attribution._heatmap(ax, maps[0], "t", ex["tokens"], ex["tokens"])
    assert [t.get_text() for t in ax.get_xticklabels()] == ex["tokens"][::2]  # 60 tokens: every other one
    plt.close(fig)


def test_figure_1_sets_five_heads_out_as_three_and_two(figures, tmp_path):
    """Five heads wrapped the fifth alone onto a second row (about 300 px blank): rows as even as
    they go, and no text colliding."""
    import numpy as np
    from conftest import make_map

    from attnscope.report.general import plot_token_lines

    n = 8
    a = np.tile(np.eye(n)[None, None], (2, 6, 1, 1))
    m = make_map(a, ["[CLS]"] + [f"w{i}" for i in range(n - 2)] + ["[SEP]"])
    fig = plot_token_lines(m, [(0, h, f"label {h}") for h in range(5)])
    shown = [ax for ax in fig.axes if ax.get_title()]
    assert len(shown) == 5 and fig.axes[0].get_gridspec().get_geometry() == (2, 3)
    assert text_collisions(fig) == []


def test_figure_1_panels_are_as_wide_as_their_longest_labels(figures, tmp_path):
    """Four heads side by side with long words: each panel's right column of labels ran into the
    next panel's left column ("instruments" into "afternoons"); panels are sized by the labels
    measured, as many side by side as the report's width holds, and a label past 16 characters
    ends in an ellipsis."""
    import numpy as np
    from conftest import make_map

    from attnscope.report.general import LABEL_CHARS, REPORT_WIDTH_IN, plot_token_lines

    words = ["instruments", "afternoons", "unquestionably", "librarian", "characteristically-long-word"]
    n = len(words) + 2
    a = np.tile(np.full((n, n), 1.0 / n)[None, None], (2, 4, 1, 1))
    m = make_map(a, ["[CLS]"] + words + ["[SEP]"])
    fig = plot_token_lines(m, [(0, h, f"label {h}") for h in range(4)])
    assert fig.get_size_inches()[0] <= REPORT_WIDTH_IN  # 2 x 2: four panels this wide would not fit
    assert fig.axes[0].get_gridspec().get_geometry() == (2, 2)
    assert text_collisions(fig) == []
    shown = {t.get_text() for ax in fig.axes for t in ax.texts}
    assert "characteristically-long-word"[:LABEL_CHARS - 1] + "\u2026" in shown and "unquestionably" in shown
