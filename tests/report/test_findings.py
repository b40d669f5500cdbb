"""Findings that say no more than their numbers: for every family, the heads and numbers a
summary sentence cites belong to the set that sentence names, checked against the rows the
same run computed (syntax and coreference: tests/families/test_syntax_cli.py, tests/families/test_coref_report.py).

Each check reads the cited names out of the sentence and compares them with a set worked out
here from the run's own tables, never with expected prose.
"""

from __future__ import annotations

import re
from importlib.resources import files
from pathlib import Path

import numpy as np
import pytest
from conftest import says

from attnscope.data.records import HeadId

DEMO_TEXT = Path(str(files("attnscope") / "demo_data" / "text.txt"))
HEAD = r"\d+-\d+"


def named_heads(sentence: str) -> list[str]:
    """The 1-indexed ``layer-head`` names a sentence cites, in order."""
    return re.findall(rf"(?<![\d.-])({HEAD})(?![\d-])", sentence)


def table(section, name: str) -> list[dict]:
    return next(t.rows for t in section.tables if t.name == name)


def one(findings: list[str], pattern: str) -> str:
    found = [f for f in findings if re.search(pattern, f)]
    assert len(found) == 1, (pattern, findings)
    return found[0]


# -- general: hand-made maps with known heads through the real analyses and writer -----------

def _maps(rng, n_examples=6, L=2, H=3):
    """Maps of ``[CLS] w... [SEP]`` where head 1-1 looks at the previous token, 1-2 at the next,
    and layer 2 at the separator (>= 0.7 each); the rest is random."""
    from conftest import make_map

    out = []
    for i in range(n_examples):
        n = 8 + i % 3
        a = rng.dirichlet(np.ones(n), size=(L, H, n))  # [L H n n]
        for q in range(n):
            for (layer, head), target in (((0, 0), q - 1), ((0, 1), q + 1), *(((1, h), n - 1) for h in range(H))):
                if 0 <= target < n:
                    a[layer, head, q] = 0.3 * a[layer, head, q]
                    a[layer, head, q, target] += 0.7
        out.append(make_map(a, ["[CLS]"] + [f"w{k}" for k in range(n - 2)] + ["[SEP]"], index=i))
    return out


def test_general_findings_name_exactly_the_heads_of_their_rows(tmp_path):
    from attnscope.analyses.clustering import general_clusters
    from attnscope.analyses.token_classes import TokenClasser
    from attnscope.families.general import general_analyses
    from attnscope.maps import AttentionBatch
    from attnscope.report.general import write_general

    maps = _maps(np.random.default_rng(0))
    analyses = general_analyses(classer=TokenClasser.positional(), causal=False)
    for batch in (AttentionBatch(maps[:3]), AttentionBatch(maps[3:])):  # hand-made maps: no model's pass
        for a in analyses:
            a.update(batch)
    results = {a.name: a.finalize() for a in analyses}
    sec = write_general(results, tmp_path, model_desc={"name": "hand-made"}, example_map=None, notes=[],
                        seed=0, run={"examples": len(maps)}, clusters=general_clusters(results))
    rows = table(sec, "general_heads")
    for key in ("previous", "next"):
        said = one(sec.findings, rf"attention on the {key} token")
        over = [r["name"] for r in rows if r[key] is not None and r[key] > 0.5]
        assert named_heads(said) == over and said.startswith(f"{len(over)} head"), said
    assert named_heads(one(sec.findings, "previous token")) == ["1-1"]  # the hand-made ones
    assert named_heads(one(sec.findings, "next token")) == ["1-2"]
    layers = table(sec, "general_layers")
    said = one(sec.findings, "over half of the attention goes to separator")
    most = max(layers, key=lambda r: r["separator"])
    over = [str(r["layer"] + 1) for r in layers if r["separator"] > 0.5]
    listed = said.split(": ", 1)[1].split(" (")[0]
    assert listed == (", ".join(over) or "none") and f"layer {most['layer'] + 1}, " in said
    assert over == ["2"]


# -- patterns: the strongest head of each pattern is the top of its column --------------------

def test_patterns_findings_cite_the_top_head_of_each_column(tmp_path):
    from attnscope.analyses.patterns import PATTERNS
    from attnscope.pipeline import run_family

    sec = run_family("patterns", {"patterns": DEMO_TEXT}, tmp_path, model="debug:bert", max_seq_len=64)
    heads, best = table(sec, "patterns_heads"), table(sec, "patterns_best")
    keys = {p: k for p, k, _ in PATTERNS}
    checked = 0
    for r in best:
        said = [f for f in sec.findings if f.startswith(f"Pattern {r['pattern']}:")]
        assert len(said) == 1
        if r.get("head") is None:
            assert named_heads(said[0]) == []
            continue
        assert named_heads(said[0]) == [r["head"]]
        key = keys[r["pattern"]]
        if key in ("bag", "pieces_both"):  # scored by a combination, not one column
            continue
        values = [h[key] for h in heads if h[key] is not None]
        cited = next(h for h in heads if h["name"] == r["head"])
        assert cited[key] == pytest.approx(max(values)) and f"{cited[key]:.3f}" in said[0]
        checked += 1
    assert checked >= 3


# -- attribution: most and least important heads are the ends of the ranking ------------------

def test_attribution_findings_cite_the_ends_of_the_importance_ranking(tmp_path):
    from attnscope.pipeline import run_family

    sec = run_family("attribution", {"attribution": DEMO_TEXT}, tmp_path, model="debug:gpt2",
                     max_seq_len=64, batch_size=4, attribution_examples=3,
                     attribution_methods="importance")
    rows = table(sec, "attribution_heads")
    by_importance = [r["name"] for r in sorted(rows, key=lambda r: -r["importance"])]
    most = named_heads(one(sec.findings, "^most important heads"))
    least = named_heads(one(sec.findings, "^least important heads"))
    k = len(most)
    assert k == len(least) == max(1, min(5, len(rows) // 2))
    assert set(most) == set(by_importance[:k]) and set(least) == set(by_importance[-k:])


# -- long context: sink and previous-token heads are the rows over the threshold ---------------

def test_longctx_findings_name_the_heads_over_each_threshold(tmp_path, debug_llama):
    from attnscope.analyses.longctx import PREVIOUS_THRESHOLD
    from attnscope.pipeline import run_family

    docs = tmp_path / "docs.txt"
    docs.write_text(DEMO_TEXT.read_text())
    sec = run_family("longctx", {"documents": docs}, tmp_path / "out", model=debug_llama, max_seq_len=64,
                     induction=2, induction_length=10, js_rows=3)
    rows = table(sec, "longctx_heads")
    thr = 0.3  # the family's default sink threshold (Gu et al. 2024)
    for key, limit, pattern in (("sink", thr, "attention sink"), ("previous", PREVIOUS_THRESHOLD, "previous token")):
        said = one(sec.findings, pattern)
        over = sorted((r for r in rows if r[key] > limit), key=lambda r: -r[key])
        assert named_heads(said) == [r["name"] for r in over][:12], said
        assert re.search(rf"\b{len(over)} (of \d+ )?heads?\b", said), said
    if any("induction heads" in f for f in sec.findings):
        said = one(sec.findings, "induction heads")
        top = max(rows, key=lambda r: r["induction"])
        says(said, f"{top['name']} ({top['induction']:.2f})")  # the strongest head and its score


# -- the atlas: the best ranking and its verdict against the random rankings -------------------

def test_atlas_findings_agree_with_the_areas_table(tmp_path, debug_llama):
    from attnscope.pipeline import run_family

    sec = run_family("atlas", {"atlas": DEMO_TEXT}, tmp_path, model=debug_llama, max_seq_len=96,
                     atlas_tasks=6, atlas_calibration=3, atlas_random=2, atlas_probe_length=16,
                     atlas_bootstrap=100, atlas_fractions="0,0.5,1")
    areas = table(sec, "atlas_areas")
    scored = [r for r in areas if r["kind"] == "score"]
    rnd = [r for r in areas if r["kind"] == "random"]
    best = max(scored, key=lambda r: r["area"])
    # the best ranking with its area and interval, and whether it beats every random ranking
    said = one(sec.findings, re.escape(f"{best['ranking']} ({best['area']:.3f}"))
    says(said, "area", f"{best['ci_low']:.3f}-{best['ci_high']:.3f}", f"{len(rnd)} seeds")
    if best["ci_low"] > max(r["ci_high"] for r in rnd):
        says(said, "beats")
    else:
        assert "beats" not in said


# -- compare: the largest change is the largest of those outside their interval ----------------

def test_compare_findings_cite_the_largest_change_outside_its_interval(tmp_path):
    from attnscope.compare import compare
    from attnscope.compare.report import findings
    from attnscope.models import load_model
    from tests.compare.test_compare import _store

    a = _store(tmp_path, "a", load_model("debug:bert", seed=0))
    b = _store(tmp_path, "b", load_model("debug:bert", seed=1))
    cmp = compare(a, b, n_boot=200)
    st, changed = cmp.stats, cmp.changed()
    said = one(findings(cmp), "head statistics changed outside")
    assert said.startswith(f"{int(changed.sum())} of {changed.size} head statistics")
    m = re.search(rf"the largest change: head ({HEAD})'s (.+?) went from (-?[\d.]+) to (-?[\d.]+) "
                  r"\(change ([-+][\d.]+), 95% interval ([-+][\d.]+) to ([-+][\d.]+)\)", said)
    if not changed.any():
        assert m is None
        return
    s, layer, head = np.unravel_index(np.argmax(np.where(changed, np.abs(st["diff"]), -1)), changed.shape)
    assert m[1] == str(HeadId(int(layer), int(head))) and m[2] == st["what"][s]
    assert float(m[5]) == pytest.approx(st["diff"][s, layer, head], abs=5e-4)
    assert float(m[6]) > 0 or float(m[7]) < 0  # the interval it quotes excludes 0
