"""The general analyses on the packaged model over 1,000 WikiText-2 segments (slow)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import js_bound, softmax_bound


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    import os

    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


@pytest.mark.slow
def test_general_on_wikitext(shared_data, default_model, tmp_path):
    from attnscope.data.unlabeled import prepare_unlabeled
    from attnscope.pipeline import run_family

    examples = prepare_unlabeled(shared_data / "wikitext-2" / "valid.sentences.txt",
                                 default_model.tokenizer, max_seq_len=128, seed=0, num_examples=500)
    assert len(examples) == 500
    rss = {}

    def progress(step, done, total):
        if step == "general: maps and statistics":
            rss[done] = _rss_mb()

    sec = run_family("general", {"text": examples}, tmp_path, model=default_model, progress=progress)
    rows = json.loads((tmp_path / "tables" / "general_heads.json").read_text())
    assert len(rows) == 6 * 12
    for r in rows:
        for k in ("current", "previous", "next", "first", "separator", "punct", "sep_to_sep",
                  "other_to_sep", "max_weight"):
            assert 0.0 <= r[k] <= 1.0 + softmax_bound(128), (r["name"], k)  # masses of float32 rows
        assert 0.0 <= r["entropy"] <= np.log(128) and 0.0 <= r["entropy_first"] <= np.log(128)
        assert r["first"] + r["separator"] + r["punct"] <= 1.0 + softmax_bound(128)
    res = json.loads((tmp_path / "results" / "general.json").read_text())
    d = np.asarray(res["analyses"]["head-distances"]["arrays"]["distances"]["data"])
    assert d.shape == (72, 72) and (np.diag(d) == 0).all() and (d <= np.log(2) + js_bound(128)).all()
    assert res["run"]["examples"] + res["run"]["skipped"] == 500
    # memory stays flat: holding the maps of the second half would add ~250 x 6 x 12 x 100^2 x 4 B
    # (~0.7 GB); batches are sorted by length, so the last (longest) batches alone may add a
    # few hundred MB of working memory
    done = sorted(rss)
    half = rss[next(d for d in done if d >= 250)]
    assert rss[done[-1]] - half < 400, {d: round(rss[d]) for d in done[::8]}
    assert max(rss.values()) < 2500
    assert any("no masked-LM head" in f for f in sec.findings)
