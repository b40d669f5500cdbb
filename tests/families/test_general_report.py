"""The general family end to end (``run_family("general", ...)``) on tiny models, the figures' data, and the CLI command."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import line_saying, one_line, says, softmax_bound

from attnscope.cli.main import main
from attnscope.data.records import Example
from attnscope.pipeline import run_family
from attnscope.report.general import plot_figure2

TEXTS = [Example(text="the cat sat on the mat.", text_pair="the dog ran, then he saw it."),
         Example(text="she said it was old."), Example(text="a man ran to the big house.",
                                                       text_pair="it was red.")]


def _lines(ax) -> dict[str, np.ndarray]:
    return {ln.get_label(): np.asarray(ln.get_ydata()) for ln in ax.get_lines()
            if not ln.get_label().startswith("_")}


def test_figure2_legend_previous_and_next_are_not_swapped():
    L, H = 3, 2
    stats = {k: np.zeros((L, H)) for k in ("first", "separator", "punct", "sep_to_sep",
                                            "other_to_sep", "current")}
    stats["previous"] = np.full((L, H), 0.9)
    stats["next"] = np.full((L, H), 0.2)
    fig = plot_figure2(stats)
    lines = _lines(fig.axes[2])
    np.testing.assert_allclose(lines["previous token"], 0.9)
    np.testing.assert_allclose(lines["next token"], 0.2)
    legend = [t.get_text() for t in fig.axes[2].get_legend().get_texts()]
    handles = fig.axes[2].get_legend().legend_handles
    colours = {t: h.get_color() for t, h in zip(legend, handles)}
    prev_line = next(ln for ln in fig.axes[2].get_lines() if ln.get_label() == "previous token")
    assert colours["previous token"] == prev_line.get_color()


@pytest.fixture(scope="module")
def bert_run(tmp_path_factory):
    from attnscope.models import load_model

    lm = load_model("debug:bert", mlm_head=True)
    out = tmp_path_factory.mktemp("general")
    steps = []
    sec = run_family("general", {"text": TEXTS}, out, model=lm, max_seq_len=256,
                     progress=lambda s, d, t: steps.append((s, d, t)))
    return lm, out, sec, steps


def test_run_general_writes_everything(bert_run):
    lm, out, sec, steps = bert_run
    for stem in ("general_heads", "general_layers", "gradient_importance"):
        for ext in ("csv", "json", "md", "tex"):
            assert (out / "tables" / f"{stem}.{ext}").is_file()
    assert (out / "tables" / "head_distances.csv").is_file()
    for stem in ("figure1_examples", "figure2_special_tokens", "figure3_gradients", "figure4_entropy",
                 "figure6_clusters"):
        assert (out / "figures" / f"{stem}.png").stat().st_size > 1000
        assert (out / "figures" / f"{stem}.svg").is_file()
    rows = json.loads((out / "tables" / "general_heads.json").read_text())
    assert [r["name"] for r in rows] == ["1-1", "1-2", "2-1", "2-2"]
    for r in rows:
        assert 0 <= r["previous"] <= 1 and 0 <= r["separator"] <= 1 and r["entropy"] >= 0
    res = json.loads((out / "results" / "general.json").read_text())
    assert set(res["analyses"]) == {"relative-position", "special-tokens", "entropy", "head-distances",
                                    "gradient-importance"}
    assert res["seed"] == 0 and res["clustering"]["params"]["mds"]["random_state"] == 0
    assert steps[-1] == ("general: maps and statistics", 3, 3)
    assert sec.key == "general" and sec.methods and len(sec.paper) == 4
    assert sec.best_heads
    for _layer, _head, idx, label in sec.best_heads:
        assert label and idx in sec.maps and sec.maps[idx].attn.shape[:2] == (2, 2)


def test_store_input_gives_the_same_numbers(bert_run, tmp_path):
    from attnscope.extract.runner import ExtractOptions
    from attnscope.jobs import extract_to_store
    from attnscope.store import open_store

    lm, out, sec, _ = bert_run
    extract_to_store(TEXTS, tmp_path / "maps", lm, options=ExtractOptions(max_seq_len=256),
                     dtype="float32", shard_size=2)
    sec2 = run_family("general", {"text": open_store(tmp_path / "maps")}, tmp_path / "out")
    a = json.loads((out / "tables" / "general_heads.json").read_text())
    b = json.loads((tmp_path / "out" / "tables" / "general_heads.json").read_text())
    n = max(len(m.tokens) for m in open_store(tmp_path / "maps"))  # float32 rows, other batches
    for ra, rb in zip(a, b):
        for k in ("previous", "next", "separator", "first", "punct", "entropy", "entropy_first"):
            assert ra[k] == pytest.approx(rb[k], abs=softmax_bound(n))
    assert any("needs the model" in f for f in sec2.findings)
    assert not (tmp_path / "out" / "figures" / "figure3_gradients.png").exists()


@pytest.mark.heavy
def test_gpt2_and_roberta_run(tmp_path, debug_gpt2, debug_roberta):
    sec = run_family("general", {"text": TEXTS}, tmp_path / "g", model=debug_gpt2, max_seq_len=256)
    assert any("no separator" in f for f in sec.findings)
    assert any("causal" in f for f in sec.findings)
    sec = run_family("general", {"text": TEXTS}, tmp_path / "r", model=debug_roberta, max_seq_len=256,
                     gradients="off", save_maps=tmp_path / "maps")
    from attnscope.store import open_store

    assert len(open_store(tmp_path / "maps")) == 3 and any("maps saved" in f for f in sec.findings)
    rows = json.loads((tmp_path / "r" / "tables" / "general_heads.json").read_text())
    assert all(r["separator"] > 0 for r in rows)  # </s> counts as a separator


def test_gradients_on_without_head_is_an_error(tmp_path, debug_bert):
    from attnscope.errors import AttnscopeError

    with pytest.raises(AttnscopeError) as e:
        run_family("general", {"text": TEXTS}, tmp_path / "x", model=debug_bert, max_seq_len=256, gradients="on")
    # the command line names the flag that exists: --general-gradients fit-head
    says(one_line(e.value), "no masked-LM head", "gradients fit-head")
    says(e.value.for_flags({"gradients": "--general-gradients"}), "--general-gradients fit-head")


def test_cli_general(tmp_path, capsys):
    data = tmp_path / "in.json"
    data.write_text(json.dumps([e.to_dict() for e in TEXTS]))
    rc = main(["analyze", "general", str(data), "--model", "debug:bert", "--out", str(tmp_path / "o"),
               "--max-seq-len", "256", "--general-gradients", "off", "--quiet"])
    assert rc == 0
    assert (tmp_path / "o" / "results" / "general.json").is_file()
    bad = tmp_path / "bad.json"
    bad.write_text('[{"text": "ok"},\n {"words": []}]')
    rc = main(["analyze", "general", str(bad), "--model", "debug:bert", "--out", str(tmp_path / "b")])
    err = capsys.readouterr().err
    assert rc == 2 and "bad.json" in err and "example 1" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "b").exists()
    rc = main(["analyze", "general", str(data), "--out", str(tmp_path / "c")])
    assert rc == 2 and "--model" in capsys.readouterr().err


def test_figure1_titles_name_head_and_behaviour(map_factory):
    from attnscope.report.general import plot_token_lines

    attn = np.zeros((1, 2, 3, 3))
    attn[0, 0] = np.eye(3)
    attn[0, 1] = 1 / 3
    m = map_factory(attn, ["[CLS]", "$x$", "[SEP]"])
    fig = plot_token_lines(m, [(0, 0, "attends to itself"), (0, 1, "attends broadly")])
    titles = [ax.get_title() for ax in fig.axes]
    assert titles == ["head 1-1\nattends to itself", "head 1-2\nattends broadly"]
    texts = {t.get_text() for t in fig.axes[0].texts}
    assert r"\$x\$" in texts  # a "$" in a token is escaped, not read as math
    assert len(fig.axes[0].collections[0].get_segments()) == 3  # only the diagonal is drawn


def test_text_input_lengths_reach_results_json(tmp_path):
    """How the pairs were built is in results/general.json (not only the report): the numbers
    equal those of the examples themselves, tokenised again here."""
    from attnscope.data.unlabeled import prepare_unlabeled
    from attnscope.models import load_model
    from attnscope.pipeline import run_family

    text = tmp_path / "wiki.txt"
    doc = ["The cat sat on the mat .", "It was a <unk> day in the town .", "Dogs ran to the park .",
           "Nobody saw the bird .", "Then it rained for a long while ."]
    text.write_text("\n".join(doc * 3) + "\n\n" + "\n".join(doc[:2]) + "\n")
    lm = load_model("debug:bert")
    run_family("general", {"text": text}, tmp_path / "o", model=lm, max_seq_len=24, gradients="off")
    got = json.loads((tmp_path / "o" / "results" / "general.json").read_text())
    info = got["run"]["text"]
    examples = prepare_unlabeled(text, lm.tokenizer, max_seq_len=24, seed=0)
    lengths = [len(lm.tokenizer(e.text, e.text_pair)["input_ids"]) for e in examples]
    assert info["examples"] == len(examples) and info["documents"] == 2
    assert info["unk_replaced"] == 4  # the <unk> sentence: three times in one document, once in the other
    assert info["mean_length"] == pytest.approx(np.mean(lengths))
    assert info["share_at_max"] == pytest.approx(np.mean([n >= 24 for n in lengths]))
    assert info["share_single_segment"] == pytest.approx(np.mean([e.text_pair is None for e in examples]))
    line_saying(got["findings"], info["summary"])
