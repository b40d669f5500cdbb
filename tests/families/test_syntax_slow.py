"""The packaged model on UD EWT: Table 1 and Table 3 complete; the best det head beats offsets."""

from __future__ import annotations

import itertools
import json

import pytest


@pytest.mark.slow
def test_packaged_model_on_ewt(shared_data, default_model, tmp_path):
    from attnscope.data.depparse import iter_depparse
    from attnscope.pipeline import run_family

    ewt = shared_data / "ud-ewt"
    # a CI-sized slice (the full EWT numbers are in docs/analyses-syntax.md)
    dev = list(itertools.islice(iter_depparse(ewt / "en_ewt-ud-dev.conllu"), 1000))
    train = list(itertools.islice(iter_depparse(ewt / "en_ewt-ud-train.conllu"), 800))
    section = run_family("syntax", {"deps": dev, "deps_train": train}, tmp_path, model=default_model,
                         batch_size=32, epochs=2, patience=1, syntax_bootstrap=200)
    tables = {t.name: t for t in section.tables}
    assert set(tables) == {"table1_syntax", "table1_syntax_heldout", "table3_probes"}
    for name in ("table1_syntax", "table1_syntax_heldout"):
        rows = {r["relation"]: r for r in tables[name].rows}
        # the frequent EWT relations are all there (>= 100 dependents in dev), "all" last
        assert {"det", "case", "nsubj", "obj", "amod", "nmod:poss", "punct"} <= set(rows)
        assert tables[name].rows[-1]["relation"] == "all"
        assert all(r["count"] >= 100 for r in tables[name].rows)
        for r in tables[name].rows:
            assert 0 <= r["ci_low"] <= r["accuracy"] <= r["ci_high"] <= 100
        det = rows["det"]
        assert det["accuracy"] > det["offset_accuracy"], det
    t3 = {r["model"]: r for r in tables["table3_probes"].rows}
    assert set(t3) == {"right-branching", "distance+glove", "random-init attn+glove", "attn",
                       "attn+glove"}
    assert all(0 < r["uas"] < 100 and r["dependents"] > 8000 for r in t3.values())
    assert t3["attn+glove"]["uas"] > t3["right-branching"]["uas"]
    saved = json.loads((tmp_path / "results" / "syntax.json").read_text())
    assert saved["tables"]["table3"] and saved["meta"]["probes"]["train_sentences"] == 800
