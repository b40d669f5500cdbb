"""The head atlas: tasks, every score by hand and against eager maps, the curve's numbers, the
family end to end and its consumers (the press itself: ``tests/engines/test_press.py``)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import says, weights_tolerance

from attnscope.analyses import atlas as A
from attnscope.data import tasks as T
from attnscope.engines import press as P
from attnscope.errors import InputError
from attnscope.extract import tasks as X
from tests.engines.test_press import _eager, _task


# -- tasks ------------------------------------------------------------------------------------------
def test_generated_tasks_are_seeded_fit_their_length_and_locate_their_needles(debug_llama):
    tok = debug_llama.tokenizer
    hay = [f"Sentence number {i} is here." for i in range(200)]
    a = T.generate_tasks(tok, count=10, length=300, haystack=hay, seed=3)
    b = T.generate_tasks(tok, count=10, length=300, haystack=hay, seed=3)
    assert a == b and a != T.generate_tasks(tok, count=10, length=300, haystack=hay, seed=4)
    assert [t.kind for t in a] == [T.KINDS[i % 5] for i in range(10)]
    for t in a:
        n = len(tok(t.context)["input_ids"])
        assert 200 < n <= 300
        assert t.needles and all(t.context[s:e] in t.answer for s, e in t.needles)
        assert all(x in t.context for x in t.answer) and t.correct(" ".join(t.answer))
        assert not t.correct("nothing")
    # depth 0 puts the needle first, depth 1 last; spread depths cover (0, 1) evenly
    first = T.generate_tasks(tok, count=1, length=300, kinds=["niah_single"], haystack=hay, depth=0.0)[0]
    last = T.generate_tasks(tok, count=1, length=300, kinds=["niah_single"], haystack=hay, depth=1.0)[0]
    assert first.needles[0][0] < 60 and last.needles[0][1] > len(last.context) - 5
    assert sorted(t.depth for t in a) == pytest.approx([(i + 0.5) / 10 for i in range(10)])
    assert "Sentence" not in T.generate_tasks(tok, count=1, length=300, kinds=["passkey"], haystack=hay)[0].context


def test_encoded_needle_marks_exactly_the_answer_tokens(debug_llama):
    enc = _task(debug_llama)
    tok = debug_llama.tokenizer
    text = tok.decode([t for t, m in zip(enc.context, enc.needle) if m])
    assert text.strip() == "4711"


@pytest.mark.parametrize("line, message", [
    ('{"context": "a b", "question": "q"', "not valid JSON"),
    ('["context"]', "must be a JSON object"),
    ('{"question": "q", "answer": "a"}', "'context' must be a non-empty string"),
    ('{"context": "a b", "question": "q", "answer": 7}', "'answer' must be"),
    ('{"context": "a b", "question": "q", "answer": []}', "'answer' must be"),
    ('{"context": "a b", "question": "q", "answer": "a", "needle": [2, 9]}', "'needle' must be"),
])
def test_task_files_with_broken_lines_are_refused_with_file_and_line(tmp_path, line, message):
    p = tmp_path / "tasks.jsonl"
    good = json.dumps({"context": "the code is 12", "question": "code?", "answer": "12"})
    p.write_text(good + "\n\n" + line + "\n", encoding="utf-8")
    with pytest.raises(InputError, match=message) as err:
        T.read_tasks(p)
    assert str(err.value).startswith(f"{p}:3:")


def test_task_file_needles_default_to_the_answers_places(tmp_path):
    p = tmp_path / "t.jsonl"
    p.write_text(json.dumps({"context": "x 12 y 12", "question": "q", "answer": ["12"]}) + "\n"
                 + json.dumps({"context": "abcdef", "question": "q", "answer": "z", "needle": [[1, 3]]}) + "\n")
    a, b = T.read_tasks(p)
    assert a.needles == ((2, 4), (7, 9)) and a.line == 1
    assert b.needles == ((1, 3),) and b.answer == ("z",)


# -- scores by hand -------------------------------------------------------------------------------------
def test_retrieval_score_by_hand():
    # context tokens 10 11 12 13 14; the needle is 12 13 (positions 2, 3)
    enc = X.Encoded(T.Task("x", "", "", ("a",)), [10, 11, 12, 13, 14], [], np.array([0, 0, 1, 1, 0], bool), 2)
    # 1 layer x 3 heads; step 1 generates 12, step 2 generates 13
    top = [np.array([[2, 1, 2]]), np.array([[3, 3, 7]])]
    # head 0 copies both (2/2), head 1 only the second (1/2: its first top is outside the needle),
    # head 2 the first (its second top, 7, lies after the context)
    assert A.retrieval_counts(enc, [12, 13], top).tolist() == [[1.0, 0.5, 0.5]]
    # a top inside the needle holding another token is no copy
    assert A.retrieval_counts(enc, [13, 12], top).tolist() == [[0.0, 0.0, 0.0]]
    no_needle = X.Encoded(enc.task, enc.context, [], np.zeros(5, bool), 2)
    assert A.retrieval_counts(no_needle, [12], top) is None


def test_grouped_query_reduction_by_hand():
    # 2 layers x 6 query heads sharing 2 KV heads (3 each): head h uses KV head h // 3
    s = np.array([[0.1, 0.7, 0.2, 0.0, 0.0, 0.3], [0.5, 0.5, 0.5, 0.9, 0.1, 0.2]])
    assert A.kv_reduce(s, 2, "max").tolist() == [[0.7, 0.3], [0.5, 0.9]]
    assert A.kv_reduce(s, 2, "mean") == pytest.approx(np.array([[1 / 3, 0.1], [0.5, 0.4]]))
    # the streaming share's need is 1 - share, reduced the same way; ranks go most needed first
    need = A.kv_reduce(A.need("streaming", {"streaming": s}), 2)
    np.testing.assert_allclose(need, [[0.9, 1.0], [0.5, 0.9]])
    assert A.rank(need).tolist() == [1, 0, 3, 2]  # ties (0.9, 0.9) by index


def test_labels_first_rule_wins_with_the_stated_thresholds():
    z = np.zeros((1, 7))
    scores = {"retrieval": np.array([[0.1, 0.5, 0, 0, 0, 0, 0]]), "induction": np.array([[0, 0.4, 0.3, 0, 0, 0, 0]]),
              "echo": np.array([[0, 0, 0, 0.3, 0, 0, 0]]), "sink": np.array([[0, 0, 0, 0, 0.6, 0.2, 0]]),
              "previous": np.array([[0, 0, 0, 0, 0.6, 0.5, 0]]), "streaming": np.array([[1, 1, 1, 1, 1, 0.95, 0.89]])}
    assert A.labels(scores).tolist() == [["retrieval", "retrieval", "induction", "echo", "sink", "positional", "other"]]
    assert A.labels({"streaming": z + 0.9}).tolist() == [["streaming"] * 7]


def test_kept_entries_area_and_paired_bootstrap_by_hand():
    # 100 tokens, 2 of 8 KV heads whole, the other 6 keep 4 + 16: (2*100 + 6*20) / 800
    assert A.kept_entries(100, 2, 8, 4, 16) == pytest.approx(0.4)
    assert A.kept_entries(10, 0, 8, 4, 16) == 1.0  # a context shorter than sink + window loses nothing
    assert A.area([0, 0.25, 1], [0.2, 0.6, 1.0]) == pytest.approx(0.25 * 0.4 + 0.75 * 0.8)
    c = {"a": np.array([[0, 0, 0, 0], [1, 1, 1, 1]], bool), "b": np.array([[0, 0, 0, 0], [1, 1, 0, 0]], bool)}
    boot = A.bootstrap_areas(c, [0, 1], resamples=200, seed=0)
    assert boot["a"][:2] == (0.5, 0.5)  # every resample of identical outcomes
    lo, hi, areas = boot["b"]
    assert 0 <= lo < 0.25 < hi <= 0.5 and areas.mean() == pytest.approx(0.25, abs=0.03)


# -- scores against eager maps ------------------------------------------------------------------------


def test_echo_and_induction_equal_the_eager_maps_on_the_random_token_sequences(causal_llama, tmp_path):
    from attnscope.families.atlas import Atlas, Options
    from attnscope.families.base import Context

    lm, _ = causal_llama
    opts = Options(atlas_probes=2, atlas_probe_length=20)
    got = Atlas._echo_induction(lm, opts, Context(lm, tmp_path, seed=5), [])
    from attnscope.families.longctx import induction_probes

    seqs, _ = induction_probes(lm, 2, 20, 5, [])
    echo, ind = np.zeros((lm.num_layers, lm.num_heads)), np.zeros((lm.num_layers, lm.num_heads))
    for ids in seqs:
        rows = np.arange(21, 41)  # the second copy: [first] + r + r with |r| = 20
        for layer, p in enumerate(_eager(lm, ids)):
            echo[layer] += p[:, rows, rows - 20].sum(-1)
            ind[layer] += p[:, rows, rows - 19].sum(-1)
    # weights of float32 softmax rows of 41 keys, their mean against float64 of the maps'
    np.testing.assert_allclose(got["echo"], echo / 40, **weights_tolerance(41))
    np.testing.assert_allclose(got["induction"], ind / 40, **weights_tolerance(41))


def test_answer_importance_equals_finite_differences_of_the_answer_loss():
    import torch

    from attnscope.analyses.lm_objective import LossInput, Objective
    from attnscope.models import load_model

    lm = load_model("debug:gpt2")
    lm.model.double()
    enc = _task(lm, 12)
    gold = [5, 9, 11]
    got = A.answer_importance(lm, enc, gold)
    ids = enc.context + enc.question + gold
    start = len(enc.context) + len(enc.question)
    item = LossInput(0, ids, None, np.arange(start - 1, len(ids) - 1), np.asarray(gold), [], np.zeros(len(ids), bool))

    def loss(gates):
        return float(Objective(lm).run([item], gates=gates).loss[0])

    for layer, head in [(0, 0), (1, 1)]:
        eps = 1e-6
        up = torch.ones(1, lm.num_layers, lm.num_heads, dtype=torch.float64)
        down = up.clone()
        up[0, layer, head] += eps
        down[0, layer, head] -= eps
        assert got[layer, head] == pytest.approx(abs(loss(up) - loss(down)) / (2 * eps), rel=1e-5)


# -- the family ----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def atlas_run(debug_llama, tmp_path_factory):
    from attnscope.pipeline import run_family

    out = tmp_path_factory.mktemp("atlas")
    from importlib.resources import files

    text = str(files("attnscope") / "demo_data" / "text.txt")
    run_family("atlas", {"atlas": text}, out, model=debug_llama, max_seq_len=96, atlas_tasks=6,
               atlas_calibration=3, atlas_random=2, atlas_probe_length=16, atlas_bootstrap=100,
               atlas_fractions="0,0.5,1")
    return out


@pytest.mark.heavy
def test_the_family_writes_the_tables_the_issue_names(atlas_run, debug_llama):
    import csv

    heads = list(csv.DictReader(open(atlas_run / "tables" / "atlas_heads.csv")))
    assert len(heads) == debug_llama.num_layers * debug_llama.num_heads
    assert {"layer", "head", "kv_head", "retrieval", "streaming", "snapkv", "echo", "induction",
            "label"} <= set(heads[0])
    assert [int(r["kv_head"]) for r in heads[:4]] == [0, 0, 1, 1]
    curve = list(csv.DictReader(open(atlas_run / "tables" / "atlas_curve.csv")))
    assert list(curve[0]) == ["ranking", "kv_fraction", "kv_heads_kept", "kv_entries_kept", "accuracy",
                              "n", "ci_low", "ci_high"]
    d = json.loads((atlas_run / "results" / "atlas.json").read_text())
    rankings = set(d["meta"]["rankings"])
    # no task is answered by a random tiny model: no retrieval score, so no retrieval ranking
    assert {"streaming", "snapkv", "echo", "induction", "random_1", "random_2"} == rankings
    for name in rankings:
        pts = [r for r in curve if r["ranking"] == name]
        assert [float(r["kv_fraction"]) for r in pts] == [0.0, 0.5, 1.0]
        assert [int(r["kv_heads_kept"]) for r in pts] == [0, 2, 4]  # 2 layers x 2 KV heads
        assert all(int(r["n"]) == 6 for r in pts)
    assert any("No ranking by retrieval" in s for s in d["summary"])
    assert all(r["f1_identical"] for r in d["tables"]["tasks"])


def test_a_head_page_shows_the_atlas_label_scores_and_what_the_greedy_ranking_did(atlas_run):
    """The head page reads the atlas's own results file: each head's label and scores, and, with
    a greedy ranking (its trace from A.greedy_order, since no calibration task of a random tiny
    model is answered), the iteration that kept the head's KV head and the accuracy around it."""
    from attnscope.analyses.family_result import FamilyResult
    from attnscope.viz.head_page import head_page_payload

    atlas = json.loads((atlas_run / "results" / "atlas.json").read_text())
    for row in atlas["tables"]["heads"]:
        labels = head_page_payload({"atlas": FamilyResult.from_json(atlas)}, None, row["name"])["labels"]
        assert [lab["label"] for lab in labels] == [f"atlas: {row['label']}"], row["name"]
        assert f"streaming {row['streaming']:.3g}" in labels[0]["evidence"]
    # 2 layers x 2 KV heads, flattened layer-major: KV head 3 is layer 2's second
    _, trace = A.greedy_order(lambda base, cand, it: [{"exact": [len(base) / 4] + [(len(base) + (c == 3)) / 4
                                                                                 for c in cand],
                                                        "logprob": [0.0] * (1 + len(cand))}], 4, until=2)
    assert [t["added"] for t in trace] == ["3", "0"] and [t["accuracy"] for t in trace] == [0.0, 0.25]
    with_greedy = {**atlas, "tables": {**atlas["tables"], "greedy": trace}}
    for name, says_ in (("2-3", "iteration 1, 0 KV heads kept before it: calibration accuracy 0.00 -> 0.25 with it"),
                        ("1-1", "iteration 2, 1 KV heads kept before it: calibration accuracy 0.25 (the last "),
                        ("1-3", "not among the 2 KV heads its 2 iterations kept")):
        got = head_page_payload({"atlas": FamilyResult.from_json(with_greedy)}, None, name)["labels"][-1]
        assert got["evidence"].startswith(says_), (name, got)


def test_the_viewer_and_compare_read_what_the_family_wrote(atlas_run, tmp_path):
    import shutil

    from attnscope.families.atlas import Atlas
    from attnscope.store.results import ResultsFolder
    from attnscope.views import family_views

    found = ResultsFolder(atlas_run)
    (r, panels), = [v for v in family_views(found) if v[0].family == "atlas"]
    assert not found.problems and r.source == "results/atlas.json"
    names = [g["name"] for g in panels["grids"]]
    assert "atlas: scores (streaming)" in names and len(panels["grids"]) == len(r.meta["relations"])
    assert len(panels["scatter"]["points"]) == 8
    from attnscope.cli.main import main

    other = tmp_path / "b"
    shutil.copytree(atlas_run, other)
    assert main(["compare", str(atlas_run), str(other), "--out", str(tmp_path / "cmp"), "--quiet"]) == 0
    tables = json.loads((tmp_path / "cmp" / "results" / "compare.json").read_text())["run_tables"]
    assert {t.name for t in Atlas.compare_tables} <= set(tables)
    areas = tables["atlas_areas"]
    assert len(areas) == len(r.tables["areas"]) and all(r["area_change"] == 0 for r in areas)
    assert (tmp_path / "cmp" / "tables" / "atlas_areas_compare.csv").is_file()
    assert "atlas_heads_compare" in (tmp_path / "cmp" / "report.html").read_text()


def _kvpress_streaming_heads(pattern: np.ndarray, ratio: float) -> set[int]:
    """kvpress 0.5.5's ``DuoAttentionPress.post_init_from_model``, restated: the
    ``round(N * ratio)`` KV heads with the smallest pattern values become streaming heads
    (``np.argsort`` over the flattened pattern; flat index ``layer * Hkv + kv_head``)."""
    n = round(pattern.size * ratio)
    return set(np.argsort(pattern, axis=None)[:n].tolist()) if n > 0 else set()


def test_rank_based_pattern_and_ratio_make_kvpress_prune_the_rankings_bottom_heads():
    from attnscope.report.atlas import compression_ratio_for, pattern_values

    # 3 layers x 5 KV heads: 15 heads, odd, so f * 15 is a half at f = 0.5 and 0.1 * 15 = 1.5
    order = np.random.default_rng(0).permutation(15)
    pattern = pattern_values(order, (3, 5))
    assert sorted(pattern.ravel().tolist()) == [i / 14 for i in range(15)]  # distinct, 0 .. 1
    assert pattern.ravel()[order[0]] == 1.0 and pattern.ravel()[order[-1]] == 0.0
    for f, kept in [(0.0, 0), (0.1, 2), (0.25, 4), (0.5, 8), (0.75, 11), (1.0, 15)]:
        m = int(round(f * 15))  # the sweep's rule (configs_for)
        assert m == kept
        assert _kvpress_streaming_heads(pattern, compression_ratio_for(m, 15)) == set(order[m:].tolist())
    # the naive ratio 1 - f prunes one head more here: round(7.5) = 8 of 15, keeping 7, not 8
    assert len(_kvpress_streaming_heads(pattern, 1 - 0.5)) == 8


def test_the_kvpress_export_is_duo_attentions_pattern_with_the_sweeps_tasks(atlas_run, causal_llama):
    """The export read back as kvpress reads it: its rule prunes exactly the ranking's bottom
    heads at each fraction of the sweep; the tasks' ids and answers are the sweep's (replayed
    here with attnscope's press on the exported ids)."""
    lm, model = causal_llama
    d = json.loads((atlas_run / "results" / "atlas.json").read_text())
    folder = atlas_run / "kvpress"
    pattern = np.loadtxt(folder / "full_attention_heads.tsv", delimiter="\t", ndmin=2)
    assert pattern.shape == (lm.num_layers, d["meta"]["kv_heads"]) == (2, 2)
    assert pattern.min() == 0.0 and pattern.max() == 1.0 and len(set(pattern.ravel())) == pattern.size
    cfg = json.loads((folder / "config.json").read_text())
    ranking = d["meta"]["exported"]
    assert (cfg["sink_size"], cfg["recent_size"], cfg["ranking"], cfg["kv_heads_total"]) == (4, 64, ranking, 4)
    assert cfg["eos_token_ids"] == sorted(A.eos_ids(model))
    order = d["meta"]["rankings"][ranking]
    assert A.rank(pattern).tolist() == order
    curve = [r for r in d["tables"]["curve"] if r["ranking"] == ranking]
    assert list(cfg["fractions"]) == ["0", "0.5", "1"] and len(curve) == 3
    for r in curve:
        got = cfg["fractions"][f"{r['kv_fraction']:g}"]
        m = r["kv_heads_kept"]
        assert got["kv_heads_kept"] == m
        assert _kvpress_streaming_heads(pattern, got["head_compression_ratio"]) == set(order[m:])
    tasks = [json.loads(x) for x in (folder / "tasks.jsonl").read_text().splitlines()]
    table = d["tables"]["tasks"]
    assert [t["index"] for t in tasks] == [r["index"] for r in table] == list(range(6))
    for t, row in zip(tasks, table):
        assert len(t["context_ids"]) == row["context_tokens"] and " | ".join(t["answer"]) == row["answer"]
        assert t["kind"] == row["kind"] and list(t["outcomes"]) == ["0", "0.5", "1"]
        assert t["outcomes"]["1"]["answer"] == row["full_cache"] and t["outcomes"]["1"]["correct"] == row["correct"]
        for o in t["outcomes"].values():
            assert o["correct"] == all(a in o["answer"] for a in t["answer"])
    for r in curve:
        outs = [t["outcomes"][f"{r['kv_fraction']:g}"] for t in tasks]
        assert np.mean([o["correct"] for o in outs]) == pytest.approx(r["accuracy"])
        assert np.mean([o["kv_entries_kept"] for o in outs]) == pytest.approx(r["kv_entries_kept"])
        assert {o["kv_heads_kept"] for o in outs} == {r["kv_heads_kept"]}
    # the exported ids and answers belong together: the press on those ids, keeping the top half
    # of the ranking, answers the same (on tasks where that half answers apart from f = 0 and 1)
    assert any(len({o["answer"] for o in t["outcomes"].values()}) == 3 for t in tasks)
    for t in tasks:
        enc = X.Encoded(T.Task(t["kind"], "", "", tuple(t["answer"])), t["context_ids"], t["question_ids"],
                        np.zeros(len(t["context_ids"]), bool), t["max_new"] - 2 * len(t["answer"]) - 2)
        assert enc.max_new == t["max_new"]
        ctx = P.prefill(lm, model, enc)
        keep = np.zeros(4, bool)
        keep[order[:2]] = True
        got = P.answer(lm, model, ctx, enc, keep.reshape(1, 2, 2), sink=4, window=64, eos=A.eos_ids(model))[0]
        assert lm.tokenizer.decode(got, skip_special_tokens=True) == t["outcomes"]["0.5"]["answer"]


@pytest.mark.parametrize("args, message", [
    (["--model", "debug:bert"], "is an encoder"),
    # the press's attention is its own: a mechanism it does not compute is named, never dropped
    (["--model", "debug:bloom"], "does not compute this model's alibi; analyze longctx does"),
    (["--model", "debug:gpt_oss"], "this model's sinks, window (window 4 tokens, sequences of 64)"),
    (["--atlas-fractions", "0.5,1"], "--atlas-fractions must hold 0, 1"),
    (["--atlas-scores", "retrieval,psychic"], "--atlas-scores must list names from retrieval"),
    (["--atlas-depth", "2"], "--atlas-depth must be at most 1"),
])
def test_cli_refuses_bad_usage_in_one_line(tmp_path, capsys, args, message):
    from attnscope.cli.main import main

    text = tmp_path / "hay.txt"
    text.write_text("one line of haystack\n")
    code = main(["analyze", "atlas", str(text), "--model", "debug:llama", "--max-seq-len", "64",
                 "--out", str(tmp_path / "out"), *args])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and message in err[0], err
    assert not (tmp_path / "out").exists()


def test_cli_names_the_broken_line_of_a_task_file(tmp_path, capsys):
    from attnscope.cli.main import main

    p = tmp_path / "tasks.jsonl"
    p.write_text('{"context": "abc 12", "question": "q", "answer": "12"}\n{"context": 5}\n')
    assert main(["analyze", "atlas", str(p), "--model", "debug:llama", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: {p}:2: field 'context' must be a non-empty string"]
    assert not (tmp_path / "o").exists()


@pytest.mark.slow
def test_smollm2_answers_and_its_retrieval_heads_matter(tmp_path, shared_data):
    """The real model on 4 tasks of 512 tokens: the whole cache answers, StreamingLLM does not
    answer more, and the retrieval heads of the calibration tasks exist."""
    from attnscope.pipeline import run_family

    run_family("atlas", {"atlas": shared_data / "wikitext-2" / "valid.sentences.txt"}, tmp_path, model="smollm2",
               max_seq_len=512, atlas_tasks=4, atlas_calibration=4, atlas_kinds="niah_single,niah_multikey",
               atlas_scores="retrieval,streaming", atlas_random=1, atlas_fractions="0,0.5,1", atlas_probes=0)
    d = json.loads((tmp_path / "results" / "atlas.json").read_text())
    full = [r for r in d["tables"]["curve"] if r["ranking"] == "full_cache"][0]
    none = [r for r in d["tables"]["curve"] if r["ranking"] == "streaming_llm"][0]
    assert full["accuracy"] >= 0.75 and none["accuracy"] <= full["accuracy"]
    assert d["meta"]["calibration_correct"] >= 3
    assert sum(r["label"] == "retrieval" for r in d["tables"]["heads"]) >= 1
    assert all(r["f1_identical"] for r in d["tables"]["tasks"])


@pytest.mark.heavy
def test_a_task_file_runs_with_a_seeded_calibration_draw(debug_llama, tmp_path):
    from attnscope.pipeline import run_family

    hay = [f"Line {i} of the haystack." for i in range(50)]
    tasks = T.generate_tasks(debug_llama.tokenizer, count=7, length=80, kinds=["niah_single"], haystack=hay)
    p = tmp_path / "tasks.jsonl"
    p.write_text("".join(json.dumps({"context": t.context, "question": t.question, "answer": list(t.answer),
                                     "needle": [list(s) for s in t.needles], "kind": "mine"}) + "\n"
                         for t in tasks))
    for out in ("a", "b"):
        run_family("atlas", {"atlas": p}, tmp_path / out, model=debug_llama, max_seq_len=96,
                   atlas_calibration=3, atlas_random=1, atlas_bootstrap=100, atlas_fractions="0,0.5,1",
                   atlas_scores="streaming")
    a, b = (json.loads((tmp_path / o / "results" / "atlas.json").read_text()) for o in ("a", "b"))
    lines = [r["line"] for r in a["tables"]["tasks"]]
    assert len(lines) == 4 and a["meta"]["calibration_tasks"] == 3 and lines == sorted(lines)
    assert lines == [r["line"] for r in b["tables"]["tasks"]]  # the draw is seeded
    assert {r["kind"] for r in a["tables"]["tasks"]} == {"mine"}


@pytest.mark.heavy
def test_a_killed_run_resumes_from_its_finished_tasks(debug_llama, tmp_path, monkeypatch):
    from importlib.resources import files

    from attnscope.pipeline import run_family

    text = str(files("attnscope") / "demo_data" / "text.txt")
    opts = dict(model=debug_llama, max_seq_len=96, atlas_tasks=5, atlas_calibration=2, atlas_random=1,
                atlas_bootstrap=100, atlas_fractions="0,0.5,1", atlas_scores="streaming,snapkv")
    run_family("atlas", {"atlas": text}, tmp_path / "whole", **opts)

    def kill(step, done, total):
        if step == "atlas: sweep" and done == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt) as stopped:
        run_family("atlas", {"atlas": text}, tmp_path / "killed", progress=kill, **opts)
    # one line: the folder, the finished units of the stage it was in, and how to go on
    says(str(stopped.value), f"interrupted: {tmp_path / 'killed'} keeps atlas's", "3 finished sweep units",
         "run the same command again")
    assert not (tmp_path / "killed" / "results" / "atlas.json").exists()
    log = (tmp_path / "killed" / "run" / "atlas-sweep.jsonl").read_text().splitlines()
    assert len(log) == 1 + 3  # the fingerprint and three finished tasks
    with open(tmp_path / "killed" / "run" / "atlas-sweep.jsonl", "a") as f:
        f.write('{"task": 3, "corr')  # a line torn by the kill
    ran = []
    real = A.SweepStep.__call__
    monkeypatch.setattr(A.SweepStep, "__call__", lambda *a, **k: ran.append(1) or real(*a, **k))
    run_family("atlas", {"atlas": text}, tmp_path / "killed", **opts)
    assert len(ran) == 2  # tasks 4 and 5 only
    whole, resumed = (json.loads((tmp_path / d / "results" / "atlas.json").read_text()) for d in ("whole", "killed"))
    assert whole["tables"] == resumed["tables"]
    assert not (tmp_path / "killed" / "run").exists()  # the partial logs are gone once the results are written
    # another job in the same folder does not read those tasks back
    monkeypatch.setattr(A.SweepStep, "__call__", real)
    (tmp_path / "killed" / "run").mkdir()
    (tmp_path / "killed" / "run" / "atlas-sweep.jsonl").write_text('{"fingerprint": "other"}\n{"task": 0}\n')
    run_family("atlas", {"atlas": text}, tmp_path / "killed", **{**opts, "atlas_tasks": 4})


@pytest.mark.heavy
def test_the_sweep_estimate_times_only_the_tasks_left(debug_llama, tmp_path, monkeypatch):
    """From ESTIMATE_FROM tasks the sweep is timed before it starts and its label says the
    estimate; a resumed run estimates only the tasks it has left, and none when none is left."""
    from importlib.resources import files

    import attnscope.families.atlas as family
    from attnscope.pipeline import run_family

    monkeypatch.setattr(family, "ESTIMATE_FROM", 2)
    asked, labels, real = [], [], A.sweep_seconds
    monkeypatch.setattr(A, "sweep_seconds", lambda lm, step, enc, tasks: asked.append(tasks) or real(lm, step, enc, tasks))
    text = str(files("attnscope") / "demo_data" / "text.txt")
    opts = dict(model=debug_llama, max_seq_len=96, atlas_tasks=5, atlas_calibration=2, atlas_random=1,
                atlas_bootstrap=100, atlas_fractions="0,0.5,1", atlas_scores="streaming")

    def kill_at(n):
        def progress(step, done, total):
            labels.append(step)
            if step.startswith("atlas: sweep") and done == n:
                raise KeyboardInterrupt
        return progress

    with pytest.raises(KeyboardInterrupt):
        run_family("atlas", {"atlas": text}, tmp_path / "out", progress=kill_at(3), **opts)
    assert asked == [5] and any(label.startswith("atlas: sweep (about ") for label in labels)
    with pytest.raises(KeyboardInterrupt):  # resumed: 2 left, then killed after the last one
        run_family("atlas", {"atlas": text}, tmp_path / "out", progress=kill_at(5), **opts)
    assert asked == [5, 2]
    run_family("atlas", {"atlas": text}, tmp_path / "out", **opts)  # every sweep task is in the log
    assert asked == [5, 2]
    timing = json.loads((tmp_path / "out" / "results" / "atlas.json").read_text())["meta"]["timing"]
    assert "sweep_estimate_seconds" not in timing and timing["sweep_seconds"] >= 0


# -- the greedy, combined and trained rankings, the kinds and the drops ----------------------------------


def test_greedy_order_by_hand():
    """An objective whose best pair is not made of the two best singles: greedy takes the best
    single first, then its best partner; ties go to the log-probability, then the lower index."""
    calls = []

    def evaluate(base, candidates, it):
        calls.append((list(base), list(candidates)))
        rows = [set(base)] + [set(base) | {c} for c in candidates]
        # task 1 is answered by head 0; task 2 by heads 0 and 2 together; log-prob favours head 3
        t1 = [0 in r for r in rows]
        t2 = [{0, 2} <= r for r in rows]
        lp = [0.1 * (3 in r) for r in rows]
        return [{"exact": t1, "logprob": lp}, {"exact": t2, "logprob": lp}]

    order, trace = A.greedy_order(evaluate, 4, until=3)
    assert order.tolist() == [0, 2, 3, 1]
    assert [t["heads"] for t in trace] == [0, 1, 2] and [t["accuracy"] for t in trace] == [0.0, 0.5, 1.0]
    assert [t["added"] for t in trace] == ["0", "2", "3"] and calls[-1] == ([0, 2], [1, 3])
    order2, trace2 = A.greedy_order(evaluate, 4, until=2, step=2)  # two heads an iteration: 0, then 3 by log-prob
    assert order2.tolist() == [0, 3, 1, 2] and len(trace2) == 1
    assert A.greedy_order(evaluate, 4, until=0)[0].tolist() == [0, 3, 1, 2]  # one evaluation orders everything


def test_combined_rankings_by_hand():
    # 2 layers x 4 query heads, 2 KV heads (query heads 0,1 -> KV 0; 2,3 -> KV 1)
    scores = {"retrieval": np.array([[0.5, 0.0, 0.0, 0.0], [0.0, 0.0, 0.2, 0.0]]),
              "induction": np.array([[0.0, 0.0, 0.1, 0.0], [0.6, 0.0, 0.0, 0.4]]),
              "importance": np.array([[0.1, 0.2, 0.9, 0.0], [0.3, 0.0, 0.5, 0.1]]),
              "streaming": np.full((2, 4), 0.5)}
    labels = A.labels(scores)
    out = A.combined_rankings(scores, labels, 2, reduce="max")
    # retrieval heads first (KV 0 of layer 0: 0.5, KV 1 of layer 1: 0.2), then induction: 2 (0.6), 1 (0.1)
    assert out["retrieval_then_induction"].tolist() == [0, 3, 2, 1]
    # labels by KV head: 0 retrieval, 1 other, 2 induction, 3 retrieval -> retrieval by importance
    # (3: 0.5, 0: 0.2), induction (2: 0.3), other (1: 0.9)
    assert out["importance_by_label"].tolist() == [3, 0, 2, 1]
    assert A.combined_rankings({"streaming": scores["streaming"]}, labels, 2, reduce="max") == {}


def _sweep(correct, answers, fractions, name="r"):
    """A Sweep of one ranking from outcome rows per fraction (f = 0 and 1 the shared rows)."""
    configs = [("full_cache", 1.0, 4), ("streaming_llm", 0.0, 0)]
    configs += [(name, f, int(round(4 * f))) for f in fractions if 0 < f < 1]
    order = [len(fractions) - 1, 0] + list(range(1, len(fractions) - 1))
    c = np.array([correct[i] for i in order], dtype=bool)
    return A.Sweep(configs, c, np.zeros(c.shape), ["" for _ in c[0]], c[0], np.ones(c.shape[1], bool),
                   [[answers[i][t] for t in range(c.shape[1])] for i in order])


def test_drops_and_kinds_by_hand():
    tasks = [X.Encoded(T.Task(k, f"noise 1234567 and {a} here", "q", (a,)), [1], [2], np.zeros(1, bool), 1)
             for k, a in [("a", "7654321"), ("a", "1111111"), ("b", "2222222")]]
    fr = [0.0, 0.5, 1.0]
    correct = [[0, 0, 0], [1, 1, 1], [0, 1, 1]]  # at 1: task 0 lost again
    answers = [["", "", ""], ["7654321", "1111111", "2222222"], [" 1234567", "1111111", "2222222"]]
    sw = _sweep(correct, answers, fr)
    _, outcome = A.curve(sw, {"r": None}, fr, resamples=100, seed=0)
    drops = A.drop_rows(outcome, fr, tasks, sw)
    assert len(drops) == 1
    d = drops[0]
    assert (d["from"], d["to"], d["lost"], d["gained"], d["heads_added"]) == (0.5, 1.0, 1, 0, 2)
    assert (d["other_number"], d["unseen_number"], d["no_number"]) == (1, 0, 0)  # 1234567 is in the context
    assert "'7654321' -> '1234567'" in d["example"]
    kinds = {r["kind"]: r for r in A.kind_rows(outcome, fr, tasks, sw)}
    assert kinds["a"]["n"] == 2 and kinds["a"]["acc_50"] == 1.0 and kinds["a"]["full_cache"] == 0.5
    assert kinds["a"]["area"] == pytest.approx(A.area(fr, [0, 1, 0.5])) and kinds["b"]["acc_75"] is None


def _answered_tasks(lm, model, n=5):
    """Task files the tiny model answers: each answer is what it generates with the whole cache."""
    tasks = []
    for i in range(n):
        words = " ".join(f"w{(i * 7 + j) % 50}" for j in range(30))
        enc = X.encode_task(lm.tokenizer, T.Task("file", words, "\n\nThe code is", ("x",)))
        gen = P.answer(lm, model, P.prefill(lm, model, enc), enc, None, sink=4, window=64)[0]
        text = lm.tokenizer.decode(gen, skip_special_tokens=True).strip()
        tasks.append({"context": words, "question": "\n\nThe code is", "answer": text[:6].strip() or "w"})
    return tasks


def test_the_greedy_ranking_end_to_end(causal_llama, tmp_path):
    """On tasks the model answers with the whole cache, the greedy ranking's iterations run
    through the executor, are resumable logs while running, and its trace starts from none."""
    from attnscope.pipeline import run_family

    lm, model = causal_llama
    p = tmp_path / "tasks.jsonl"
    p.write_text("".join(json.dumps(t) + "\n" for t in _answered_tasks(lm, model, 6)))
    run_family("atlas", {"atlas": p}, tmp_path / "out", model=lm, max_seq_len=96, atlas_calibration=3,
               atlas_random=1, atlas_bootstrap=100, atlas_fractions="0,0.5,1", atlas_scores="streaming",
               atlas_window=4, atlas_sink=1, atlas_greedy=1)
    d = json.loads((tmp_path / "out" / "results" / "atlas.json").read_text())
    order = d["meta"]["rankings"]["greedy"]
    assert sorted(order) == list(range(lm.num_layers * lm.num_kv_heads))
    trace = d["tables"]["greedy"]
    assert [t["heads"] for t in trace] == [0, 1] and trace[0]["added"] == str(order[0])
    assert {r["ranking"]: r["kind"] for r in d["tables"]["areas"]}["greedy"] == "greedy"
    assert (tmp_path / "out" / "tables" / "atlas_greedy.csv").is_file()
    assert (tmp_path / "out" / "tables" / "atlas_kinds.csv").is_file()
