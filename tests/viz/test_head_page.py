"""Head pages: the top examples kept during the general pass (bounded, mergeable), checked by brute
force against every example's own map; the page's statistics, ranks and labels; the CLI; and the
page in a real browser."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from conftest import softmax_bound

from attnscope.analyses.family_result import FamilyResult
from attnscope.analyses.relative_position import RelativePosition
from attnscope.analyses.stat import rank_of
from attnscope.analyses.top_examples import TopExamples, priority
from attnscope.cli.main import main
from attnscope.data.records import Example
from attnscope.extract.runner import extract
from attnscope.pipeline import run_family
from attnscope.viz.head_page import head_page_payload

SENTENCES = ["the cat sat on the mat .", "she said it was old , and then she left .",
             "a man ran to the big house .", "it was red .", "we saw the dog , the cat and a bird .",
             "rain fell all night on the quiet town .", "he gave her the book she wanted .",
             "the old bridge , built in stone , still stands .", "they sing .",
             "after the game the players went home , tired but happy .", "why ?",
             "the children laughed at the clown ."]
EXAMPLES = [Example(text=s) for s in SENTENCES]


def _maps(lm):
    return [m for batch in extract(EXAMPLES, lm, max_seq_len=64, batch_size=1) for m in batch]


def _brute(maps):
    """Per example, the three relative-position values ``[3 L H]`` and each row's own ``[3 L H q]``,
    by the formulas of the paper (section 3.1), one example at a time."""
    out = []
    for m in maps:
        a = m.attn.astype(np.float64)
        L, H, n, _ = a.shape
        rows = np.full((3, L, H, n), -np.inf)
        for i in range(n):
            rows[0, :, :, i] = a[:, :, i, i]
            if i > 0:
                rows[1, :, :, i] = a[:, :, i, i - 1]
            if i < n - 1:
                rows[2, :, :, i] = a[:, :, i, i + 1]
        values = np.stack([rows[0].sum(-1) / n, np.where(np.isfinite(rows[1]), rows[1], 0).sum(-1) / (n - 1),
                           np.where(np.isfinite(rows[2]), rows[2], 0).sum(-1) / (n - 1)])
        out.append((m.index, values, rows, a))
    return out


@pytest.fixture(scope="module")
def general_run(tmp_path_factory, debug_bert):
    out = tmp_path_factory.mktemp("headpage")
    run_family("general", {"text": EXAMPLES}, out, model=debug_bert, max_seq_len=64, batch_size=4)
    return out, json.loads((out / "heads" / "general.json").read_text())


def test_top_examples_are_the_highest_per_example_values(general_run, debug_bert):
    out, kept = general_run
    brute = _brute(_maps(debug_bert))
    L, H = brute[0][1].shape[1:]
    for s, stat in enumerate(("current", "previous", "next")):
        for layer in range(L):
            for head in range(H):
                want = sorted(brute, key=lambda b: (-b[1][s, layer, head], b[0]))[:5]
                got = kept["heads"][stat][layer][head]["top"]
                assert [e["example"] for e in got] == [b[0] for b in want]
                for e in got:
                    index, values, rows, a = next(b for b in brute if b[0] == e["example"])
                    # weights of float32 softmax rows of the run's maps and of these (other batches)
                    bound = softmax_bound(a.shape[-1])
                    assert e["value"] == pytest.approx(values[s, layer, head], abs=bound)
                    assert rows[s, layer, head, e["query"]] == pytest.approx(rows[s, layer, head].max(), abs=bound)
                    row = a[layer, head, e["query"]]
                    assert e["weights"] == pytest.approx(np.sort(row)[::-1][:5], abs=1e-4)
                    assert e["weights"] == pytest.approx(row[e["keys"]], abs=1e-4)
    # the sharpest rows (entropy's statistic "max_weight": mean over rows of the largest weight)
    sharp = [(b[0], b[3].max(-1).mean(-1)) for b in brute]
    for layer in range(L):
        for head in range(H):
            want = [i for i, _ in sorted(sharp, key=lambda b: (-b[1][layer, head], b[0]))[:5]]
            assert [e["example"] for e in kept["heads"]["max_weight"][layer][head]["top"]] == want
    # every example a head names comes with its tokens, the model's own pieces
    assert set(kept["examples"]) <= {str(i) for i in range(len(EXAMPLES))}
    first = kept["examples"]["0"]
    assert first["tokens"][0] == "[CLS]" and first["tokens"][-1] == "[SEP]"


def test_typical_examples_are_the_sampled_ones_nearest_the_mean(general_run, debug_bert):
    out, kept = general_run
    brute = _brute(_maps(debug_bert))
    sampled = sorted(brute, key=lambda b: (int(priority(b[0])), b[0]))[:16]  # all 12 here
    general = json.loads((out / "results" / "general.json").read_text())
    for r in general["tables"]["general_heads"][:10]:
        mean = r["previous"]
        want = sorted(sampled, key=lambda b: (abs(b[1][1, r["layer"], r["head"]] - mean), b[0]))[:2]
        got = kept["heads"]["previous"][r["layer"]][r["head"]]["typical"]
        assert [e["example"] for e in got] == [b[0] for b in want]


def test_merged_shards_keep_what_one_pass_keeps(debug_bert):
    maps = _maps(debug_bert)
    whole = RelativePosition()
    whole.update(maps)
    rng = np.random.default_rng(0)
    for _ in range(3):
        order = rng.permutation(len(maps))
        parts = [RelativePosition() for _ in range(3)]
        for j, i in enumerate(order):
            parts[j % 3].update([maps[i]])
        merged = parts[0].merge(parts[1]).merge(parts[2])
        a, b = whole.finalize(), merged.finalize()
        assert json.dumps(a.examples, sort_keys=True) == json.dumps(b.examples, sort_keys=True)


def test_the_top_set_stays_bounded_and_drops_unused_tokens():
    t = TopExamples(("x",), k=2, keys=1, sample=1)
    for i in range(50):
        attn = np.full((1, 1, 2, 2), 0.5)
        units = {"tokens": [f"t{i}", "u"], "text": None, "level": "token", "segment": [0, 0],
                 "special": [False, False]}
        t.offer(i, units, np.array([[[float(i % 7)]]]), np.array([True]), np.zeros((1, 1, 1, 2)), attn)
    kept = t.to_json({"x": np.array([[3.0]])})
    top = kept["heads"]["x"][0][0]["top"]
    assert [(e["example"], e["value"]) for e in top] == [(6, 6.0), (13, 6.0)]  # ties: lowest index first
    drawn = min(range(50), key=lambda i: (int(priority(i)), i))
    assert set(kept["examples"]) <= {"6", "13", str(drawn)}
    assert len(t.tokens) <= 2 * (2 + 1)


def test_rank_counts_strictly_higher_heads():
    v = np.array([[0.3, 0.9, np.nan], [0.9, 0.1, 0.3]])
    assert [rank_of(v, 0, 1), rank_of(v, 1, 0), rank_of(v, 0, 0), rank_of(v, 1, 1), rank_of(v, 0, 2)] == \
        [1, 1, 3, 5, None]


def test_page_payload_ranks_and_intervals(general_run):
    out, kept = general_run
    general = json.loads((out / "results" / "general.json").read_text())
    rows = general["tables"]["general_heads"]
    p = head_page_payload({"general": FamilyResult.from_json(general)}, kept, "2-1")
    prev = next(s for s in p["stats"] if s["key"] == "previous")
    mine = next(r for r in rows if r["name"] == "2-1")
    assert prev["value"] == mine["previous"]
    assert prev["rank"] == 1 + sum(r["previous"] > mine["previous"] for r in rows)
    assert prev["of"] == len(rows) and prev["examples"] == len(EXAMPLES)
    # the interval: mean +- 1.96 standard errors of the per-example values (worked out here)
    se = general["analyses"]["relative-position"]["meta"]["standard_error"]["previous"][1][0]
    assert prev["high"] == pytest.approx(mine["previous"] + 1.959964 * se, rel=1e-6)
    assert p["examples"]["previous"] == kept["heads"]["previous"][1][0]
    assert set(p["units"]) == {str(e["example"]) for c in p["examples"].values()
                               for e in c["top"] + c["typical"]}
    # the head's labels are the families' labels with their evidence, whatever examples it shows
    # (an example's token texts once overwrote them: "undefined - undefined" on the page)
    assert p["labels"] == head_page_payload({"general": FamilyResult.from_json(general)}, None, "2-1")["labels"]
    assert p["labels"] and all(set(x) == {"family", "label", "evidence"} for x in p["labels"])


def test_cli_writes_the_page_and_a_head_view_per_example(general_run, tmp_path, capsys):
    out, kept = general_run
    page = tmp_path / "page.html"
    assert main(["view", str(out), "--head-page", "2-1", "--out", str(page)]) == 0
    html = page.read_text()
    data = json.loads(re.search(r'id="attnscope-data" type="application/json">(.*?)</script>', html, re.S).group(1))
    assert data["head"] == "2-1" and data["pages"]
    for index, rel in data["pages"].items():
        view = (tmp_path / rel).read_text()
        p = json.loads(re.search(r'id="attnscope-data" type="application/json">(.*?)</script>', view, re.S).group(1))
        assert p["index"] == int(index) and p["state"]["layer"] == 1 and p["state"]["heads"] == [0]
        assert p["tokens"] == kept["examples"][index]["tokens"]
    assert main(["view", str(out), "--head-page", "3-1", "--out", str(page)]) == 2
    assert "2 layers" in capsys.readouterr().err


def test_a_corrupt_head_examples_file_is_one_line_and_no_page(general_run, tmp_path, capsys):
    import shutil

    out, _ = general_run
    copy = tmp_path / "run"
    shutil.copytree(out, copy)
    heads = copy / "heads" / "general.json"
    heads.write_text(heads.read_text()[:1000])  # cut short, as a full disk would leave it
    page = tmp_path / "page.html"
    assert main(["view", str(copy), "--head-page", "2-1", "--out", str(page)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(heads) in err and "corrupt" in err
    assert not page.exists() and not (tmp_path / "page_examples").exists()


@pytest.mark.browser
def test_head_page_in_a_browser(browser, general_run, tmp_path):
    from attnscope.views import head_page_html

    out, kept = general_run
    page = tmp_path / "page.html"
    page.write_text(head_page_html(out, "2-1"))
    ctx = browser.new_context(viewport={"width": 1280, "height": 900})
    pg = ctx.new_page()
    errors = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    pg.goto(page.as_uri())
    pg.wait_for_selector('#attnscope-root[data-ready="true"]')
    strips = pg.locator(".hp-top .hp-strip")
    assert strips.count() == 5
    stat = pg.locator("select.hp-stat").input_value()
    top = kept["heads"][stat][1][0]["top"]
    assert [int(strips.nth(i).get_attribute("data-example")) for i in range(5)] == [e["example"] for e in top]
    # keyboard: a strip without a head view toggles the whole example with Enter
    before = strips.nth(0).locator(".hp-tok").count()
    strips.nth(0).focus()
    pg.keyboard.press("Enter")
    assert pg.locator(".hp-top .hp-strip").nth(0).locator(".hp-tok").count() >= before
    assert pg.evaluate("document.documentElement.scrollWidth") <= 1280
    assert errors == []
    ctx.close()


def _tree_lines(words):
    return "\n".join(f"{i}\t{w}\t{w}\t{u}\t_\t_\t{h}\t{r}\t_\t_" for i, (w, h, r, u) in enumerate(words, 1))


def test_syntax_evidence_leaves_out_thin_relations_and_labels_only_what_beats_the_offset(tmp_path, debug_bert):
    """On the syntax family's own results: a relation seen once (every head 0% or 100% of it) is
    neither ranked nor labelled, and a relation the best offset already gets right every time
    (det: the noun is always the next word) gives no "tracks" label however well a head does."""
    from attnscope.viz.head_page import MIN_ITEMS, syntax_evidence

    nouns = ["dog", "bird", "cat", "fish", "cow", "hen", "fox", "owl", "ant", "bee", "elk", "yak"]
    trees = [_tree_lines([("the", 2, "det", "DET"), (n, 3, "nsubj", "NOUN"), ("slept", 0, "root", "VERB")])
             for n in nouns]
    trees.append(_tree_lines([("we", 2, "nsubj", "PRON"), ("saw", 0, "root", "VERB"), ("it", 2, "obj", "PRON")]))
    (tmp_path / "deps.conllu").write_text("\n\n".join(trees) + "\n\n")
    out = tmp_path / "out"
    run_family("syntax", {"deps": tmp_path / "deps.conllu"}, out, model=debug_bert, max_seq_len=32)
    syntax = json.loads((out / "results" / "syntax.json").read_text())
    relations = syntax["meta"]["relations"]
    total = dict(zip(relations, syntax["arrays"]["total"]["data"]))
    assert total["obj"] == 1 < MIN_ITEMS <= total["det"] == len(nouns)  # the producer counts it
    best = {r["relation"]: r for r in syntax["tables"]["table1"]}
    for rel in ("det", "nsubj"):  # Table 1 names a best head; the offset does as well or better
        assert best[rel]["count"] >= MIN_ITEMS and best[rel]["offset_accuracy"] == 100.0
    L, H = debug_bert.num_layers, debug_bert.num_heads
    for layer in range(L):
        for head in range(H):
            labels, rows = syntax_evidence(FamilyResult.from_json(syntax), layer, head, f"{layer + 1}-{head + 1}")
            assert not [x for x in labels if x["label"].split()[1] in ("det", "nsubj", "obj")], labels
            assert rows and not [r for r in rows if r["what"].startswith("obj ")], rows


@pytest.mark.parametrize("name", ["debug_bert", "debug_roberta"])
def test_a_word_split_into_pieces_reads_as_the_word(name, request):
    """Head pages write an example as running text: WordPiece's ``##`` pieces and byte-level
    pieces without a leading space join the piece before them (they were drawn apart, so
    "unaffable" read "u n a f f a b l e"); a space that is a token of its own stays visible."""
    from attnscope.analyses.top_examples import units_of
    from attnscope.viz.head_page import unit_labels

    lm = request.getfixturevalue(name)
    text = "The unaffable lighthouse keepers waved"
    m = next(iter(extract([Example(text=text)], lm, max_seq_len=64, batch_size=1))).items[0]
    labels, spaces = unit_labels(units_of(m))
    assert len(labels) == len(spaces) == len(m.tokens) and not spaces[0]
    words = [i for i, s in enumerate(m.special) if not s]
    line = "".join((" " if spaces[i] and i != words[0] else "") + labels[i] for i in words)
    assert line.replace("\u00b7", " ").replace("  ", " ") in (text, text.lower()), (m.tokens, line)
    assert len(words) > len(text.split())  # the tiny vocabulary splits the words into pieces


def test_coref_evidence_counts_the_mentions_of_each_type(tmp_path, debug_bert):
    """The coref rows of a head page carry the number of mentions scored (the items column was
    blank), from the coref family's own results; a mention type seen fewer than MIN_ITEMS times
    is left out, as a thin relation is."""
    from attnscope.pipeline import demo_inputs
    from attnscope.viz.head_page import MIN_ITEMS, coref_evidence

    out = tmp_path / "out"
    run_family("coref", {"coref": [demo_inputs()["coref"]]}, out, model=debug_bert)
    coref = json.loads((out / "results" / "coref.json").read_text())
    counts = {"all": coref["meta"]["mentions"], **coref["meta"]["mentions_by_type"]}
    assert counts["all"] == sum(coref["meta"]["mentions_by_type"].values())
    _, rows = coref_evidence(FamilyResult.from_json(coref), "1-1")
    shown = {r["what"].split(", ")[1].split()[0]: r["count"] for r in rows}
    assert shown == {k: v for k, v in counts.items() if v >= MIN_ITEMS} and shown
