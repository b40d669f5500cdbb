"""A statistic declared once (:mod:`attnscope.analyses.stat`) reaches every consumer: the results
file, the report's tables, a head's page, ``compare`` and the streaming general family, with
the value worked out here from the maps themselves."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
from conftest import softmax_bound

from attnscope.analyses import stat
from attnscope.analyses.family_result import FamilyResult
from attnscope.analyses.special_tokens import SpecialTokens
from attnscope.analyses.stat import Stat, declared_for_now
from attnscope.analyses.token_classes import TokenClasser
from attnscope.data.records import Example
from attnscope.extract.encode import Encoder
from attnscope.extract.runner import Extractor
from attnscope.pipeline import run_family
from attnscope.viz.head_page import head_page_payload

pytest.importorskip("torch")

TEXTS = ["the cat sat on the mat . a dog ran , she said",
         "when the old man saw the red house , he ran .",
         "it is big", "the the the"]

#: The toy: how much of each row goes to the word "the" (never a special token).
TOY = Stat("to_the", what="attention to the word 'the'", formula="sum_i sum_{j: 'the'} a[i,j] / n",
           source="a test", analysis="special-tokens", keys=lambda text, special: text == "the" and not special)


def _by_hand(lm, texts) -> np.ndarray:
    """``[L H]``: per example, the mass of every row on the keys spelled "the" over ``n`` rows,
    then the mean over examples, from the eager maps in float64."""
    enc = Encoder(lm)  # the texts are far below any length limit
    encoded = [enc.encode(Example(text=t), i) for i, t in enumerate(texts)]
    per_example = []
    for m in Extractor(lm).run_batch(encoded):
        keys = np.array([TokenClasser.bare(t) == "the" and not s for t, s in zip(m.tokens, m.special)])
        a = np.asarray(m.attn, dtype=np.float64)  # [L H n n]
        per_example.append(a[..., keys].sum((-1, -2)) / m.num_units)
    return np.mean(per_example, axis=0)


def _grid(rows, key):
    L, H = 1 + max(r["layer"] for r in rows), 1 + max(r["head"] for r in rows)
    out = np.full((L, H), np.nan)
    for r in rows:
        out[r["layer"], r["head"]] = r[key]
    return out


@pytest.mark.parametrize("engine", ["maps", "streaming"])
def test_a_toy_statistic_declared_once_reaches_results_tables_and_head_pages(tmp_path, debug_llama, engine):
    want = _by_hand(debug_llama, TEXTS)
    assert (want > 0.01).all()  # every head puts some weight on "the": the statistic is not zero
    with declared_for_now(TOY):
        sec = run_family("general", {"text": [Example(text=t) for t in TEXTS]}, tmp_path, model=debug_llama,
                         max_seq_len=64, batch_size=2, general_engine=engine, gradients="off")
    assert "to_the" not in {s.name for s in stat.declared()}  # the with block took it back
    results = json.loads((tmp_path / "results" / "general.json").read_text())
    assert results["run"]["engine"] == engine
    record = next(r for r in results["stats"] if r["name"] == "to_the")  # the file carries the record
    assert record["what"] == TOY.what and record["analysis"] == "special-tokens" and record["keys"]
    # the maps' rows are float32 (maps engine) or the tiles' rows are (streaming): one softmax each
    bound = softmax_bound(64)
    rows = results["tables"]["general_heads"]
    np.testing.assert_allclose(_grid(rows, "to_the"), want, atol=bound, rtol=0)
    with open(tmp_path / "tables" / "general_heads.csv", newline="") as f:
        table = list(csv.DictReader(f))
    np.testing.assert_allclose(_grid([{**r, "layer": int(r["layer"]), "head": int(r["head"]),
                                       "to_the": float(r["to_the"])} for r in table], "to_the"),
                               want, atol=bound, rtol=0)
    heads_table = next(t for t in sec.tables if t.name == "general_heads")  # the report's table
    assert "to_the" in heads_table.columns and "to_the: attention to the word 'the'" in heads_table.caption
    # a head's page, read from the results file alone (the statistic is no longer declared)
    page = head_page_payload({"general": FamilyResult.from_json(results)}, None, "2-3")
    shown = next(s for s in page["stats"] if s["key"] == "to_the")
    assert shown["what"] == TOY.what and shown["value"] == pytest.approx(want[1, 2], abs=bound)
    v = want[1, 2]  # its rank counts the heads above it; heads within the bound of it may go either way
    assert 1 + int((want > v + 2 * bound).sum()) <= shown["rank"] <= 1 + int((want > v - 2 * bound).sum())
    assert shown["of"] == want.size


def test_a_toy_statistic_reaches_compare(tmp_path, debug_bert):
    from attnscope.compare import compare
    from attnscope.extract.runner import ExtractOptions
    from attnscope.jobs import extract_to_store
    from attnscope.models import load_model

    other = load_model("debug:bert", seed=1)
    stores = []
    for name, lm in (("a", debug_bert), ("b", other)):
        extract_to_store([Example(text=t) for t in TEXTS], tmp_path / name, lm, options=ExtractOptions(),
                         dtype="float32")
        stores.append(tmp_path / name)
    with declared_for_now(TOY):
        cmp = compare(*stores, n_boot=100)
    s = cmp.stats["statistics"].index("to_the")
    bound = softmax_bound(32)
    np.testing.assert_allclose(cmp.stats["a"][s], _by_hand(debug_bert, TEXTS), atol=bound, rtol=0)
    np.testing.assert_allclose(cmp.stats["b"][s], _by_hand(other, TEXTS), atol=bound, rtol=0)
    from attnscope.compare.report import head_rows, results_json

    assert "to_the" in results_json(cmp)["statistics"]
    assert {r["statistic"] for r in head_rows(cmp)} >= {"to_the", "entropy"}


def test_declaring_a_name_twice_is_refused_and_key_classes_need_a_fresh_analysis():
    with declared_for_now(TOY):
        with pytest.raises(ValueError, match="already declared"):
            stat.declare(Stat("to_the", what="something else", formula="", source="", analysis="entropy"))
        st = SpecialTokens()
        assert st.stats[-1] == "to_the" and st.params()["declared_key_classes"] == ["to_the"]
    # an analysis made without the toy cannot be merged with one made with it
    with pytest.raises(ValueError):
        SpecialTokens().merge(st)
