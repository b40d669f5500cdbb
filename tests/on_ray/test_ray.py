"""Extraction and analyses on Ray (attnscope.on_ray.cluster) against the single-process run.

One local cluster (``ray.init(num_cpus=2)``) for the whole module; tiny random models. Skipped
when Ray is not installed (``pip install -e ".[ray]"``), except the checks that need no Ray.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import one_line, says

from attnscope.analyses.base import ANALYSES
from attnscope.analyses.entropy import Entropy
from attnscope.data.io import example_from_dict
from attnscope.errors import AttnscopeError
from attnscope.executor import run_pass
from attnscope.extract import ExtractOptions, extract
from attnscope.jobs import extract_to_store
from attnscope.store import open_store

SRC = Path(__file__).resolve().parents[2] / "src"
WORDS = ("the a cat dog sat mat ran saw man woman house big small red old new said who what "
         "unbelievable housing").split()


def _import_all_analyses() -> None:
    import importlib
    import pkgutil

    import attnscope.analyses as pkg

    for info in pkgutil.walk_packages(pkg.__path__, prefix="attnscope.analyses."):
        importlib.import_module(info.name)


_import_all_analyses()


def corpus(n: int, seed: int = 0, longest: int = 24) -> list:
    rng = random.Random(seed)
    return [example_from_dict({"words": [rng.choice(WORDS) for _ in range(rng.randint(1, longest))]}, i)
            for i in range(n)]


def map_analyses(lm, word_level: bool) -> list:
    """Every registered analysis that folds maps and needs nothing beyond them (and, at word
    level with dependency trees, the syntax ones), with the parameters the contract test uses."""
    have = {"word_level", "dependencies"} if word_level else set()
    token_only = {"vig-patterns"} if word_level else set()  # refuses word-level maps by design
    return [cls.for_model(lm, seed=0) for name, cls in sorted(ANALYSES.items())
            if cls.consumes == "maps" and set(cls.requires) <= have and name not in token_only]


def assert_same_result(a, b, where: str = "") -> None:
    """Results equal: integers and strings exactly, floats to 1e-9 relative."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and sorted(a) == sorted(b), where
        for k in a:
            assert_same_result(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same_result(x, y, f"{where}[{i}]")
    elif isinstance(a, np.ndarray):
        assert a.shape == b.shape and a.dtype == b.dtype, where
        if a.dtype.kind == "f":
            np.testing.assert_allclose(a, b, rtol=1e-9, atol=0, equal_nan=True, err_msg=where)
        else:
            assert np.array_equal(a, b), where
    elif isinstance(a, float):
        assert (np.isnan(a) and np.isnan(b)) or a == pytest.approx(b, rel=1e-9, abs=0), where
    else:
        assert a == b, where


def assert_same_results(expected: dict, analyses: list) -> None:
    assert [a.name for a in analyses] == list(expected)
    for a in analyses:
        r, e = a.finalize(), expected[a.name]
        assert_same_result(e.arrays, r.arrays, a.name)
        assert_same_result(json.loads(json.dumps(e.tables, default=float)),
                           json.loads(json.dumps(r.tables, default=float)), a.name)


def assert_same_store(local: Path, ray_store: Path) -> None:
    """Same index (example -> shard, position, length; every shard's sha256) and manifest."""
    assert json.loads((local / "index.json").read_text()) == json.loads((ray_store / "index.json").read_text())
    m1, m2 = (json.loads((p / "manifest.json").read_text()) for p in (local, ray_store))
    m1.pop("command"), m2.pop("command")
    assert m1 == m2
    assert sorted(os.listdir(local / "shards")) == sorted(os.listdir(ray_store / "shards"))


@pytest.fixture(scope="module")
def cluster():
    ray = pytest.importorskip("ray", reason="Ray is not installed (pip install -e '.[ray]')")
    from attnscope.on_ray.cluster import worker_runtime_env

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    # Ray runs each 1-CPU actor with one torch thread; float32 sums depend on the thread count,
    # so the single-process references here use one thread too (docs/scale.md, "guaranteed")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, object_store_memory=200 << 20,
             runtime_env=worker_runtime_env())
    yield ray
    ray.shutdown()
    torch.set_num_threads(threads)


# -- no Ray needed ---------------------------------------------------------------------------

def test_the_cli_and_the_library_never_import_ray():
    code = ("import sys, attnscope, attnscope.cli.main, attnscope.pipeline, attnscope.on_ray\n"
            "assert 'ray' not in sys.modules, 'ray was imported'\n")
    subprocess.run([sys.executable, "-c", code], check=True, env=dict(os.environ, PYTHONPATH=str(SRC)))


def test_ray_flag_without_ray_is_one_line_naming_the_extra(tmp_path, monkeypatch, capsys):
    from attnscope.cli.main import main

    inp = tmp_path / "in.json"
    inp.write_text(json.dumps([{"text": "the cat sat"}]))
    monkeypatch.setitem(sys.modules, "ray", None)  # as if not installed
    for argv in (["extract", str(inp), "-o", str(tmp_path / "s"), "--debug", "--ray"],
                 ["analyze", "general", str(inp), "-o", str(tmp_path / "a"), "-m", "debug", "--ray"],
                 ["run", "--text", str(inp), "-o", str(tmp_path / "r"), "-m", "debug", "--ray"]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1
        says(err[0], "error: ", "--ray", "not installed", "pip install 'attnscope[ray]'")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.json"]  # nothing written
    assert main(["extract", str(inp), "-o", str(tmp_path / "s"), "--debug", "--workers", "2"]) == 2
    says(one_line(capsys.readouterr().err.strip()), "error: ", "--workers", "--ray")


# -- on a local cluster ----------------------------------------------------------------------

def test_units_end_on_shard_boundaries_and_cover_the_plan(debug_bert):
    from attnscope.extract import Extractor
    from attnscope.on_ray.cluster import plan_units

    exs = corpus(50)
    ex = Extractor(debug_bert, ExtractOptions(batch_size=3, window=20))
    units = plan_units(ex, exs, shard_size=8, unit_examples=8)
    positions = [p for u in units for ps, _ in u.batches for p in ps]
    assert positions == list(range(50))  # every plan position once, in order
    for u in units[:-1]:
        last = u.batches[-1][0][-1]
        assert (last + 1) % 8 == 0 and u.examples >= 8  # a unit ends where a shard ends
    shards = [u.shards(8) for u in units]
    assert all(not (a & b) for i, a in enumerate(shards) for b in shards[i + 1:])  # no shard shared


def test_store_and_analyses_equal_the_single_process_run(cluster, debug_bert, tmp_path):
    from attnscope.on_ray.cluster import extract_on_ray

    exs = corpus(70)
    opts = ExtractOptions(batch_size=4)
    extract_to_store(exs, tmp_path / "local", debug_bert, options=opts, shard_size=16)
    expected = run_pass(open_store(tmp_path / "local"), map_analyses(debug_bert, False)).results
    seen = []
    out = extract_on_ray(exs, tmp_path / "ray", debug_bert, options=opts, shard_size=16, workers=2,
                         analyses=map_analyses(debug_bert, False), progress=lambda d, t: seen.append((d, t)))
    assert_same_store(tmp_path / "local", tmp_path / "ray")
    assert_same_results(expected, out.analyses)
    assert out.units == 5 and out.units_run == 5  # 70 examples, 16 per shard
    assert seen[-1] == (70, out.stats.tokens) and [d for d, _ in seen] == sorted(d for d, _ in seen)
    assert open_store(tmp_path / "ray").complete


@pytest.mark.slow
def test_word_level_decoder_with_dependencies_without_a_store(cluster, debug_gpt2):
    """No store: analyses see float32 maps, as a pass in this process does."""
    from attnscope.data.depparse import iter_depparse
    from attnscope.on_ray.cluster import extract_on_ray
    from attnscope.pipeline import demo_inputs

    exs = list(iter_depparse(demo_inputs()["deps"]))
    opts = ExtractOptions(batch_size=3, word_level=True)
    here = run_pass(exs, map_analyses(debug_gpt2, True), model=debug_gpt2, options=opts)
    expected, stats = here.results, here.stats
    assert "dependency-heads" in expected
    out = extract_on_ray(exs, None, debug_gpt2, options=opts, workers=2, unit_examples=4,
                         analyses=map_analyses(debug_gpt2, True))
    assert_same_results(expected, out.analyses)
    assert out.units == 2  # 12 sentences in batches of 3, at least 4 per unit: 6 + 6
    assert (out.stats.examples_out, out.stats.tokens) == (stats.examples_out, stats.tokens)
    assert stats.examples_out == 12


def test_a_bad_example_on_a_worker_is_one_line_and_leaves_no_store(cluster, debug_bert, tmp_path):
    from attnscope.on_ray.cluster import extract_on_ray

    with pytest.raises(AttnscopeError) as info:
        extract_on_ray(corpus(40), tmp_path / "s", debug_bert, shard_size=8, workers=2,
                       analyses=[RefuseExample(23)])
    assert str(info.value) == "example 23: refused by the test analysis"
    assert not (tmp_path / "s").exists()  # the job started the store, so it is removed


def test_cli_extract_on_ray_equals_local_and_bad_input_is_the_same_line(cluster, tmp_path, capsys):
    from attnscope.cli.main import main

    inp = tmp_path / "in.json"
    inp.write_text(json.dumps([e.to_dict() for e in corpus(30)]))
    common = ["--debug", "--shard-size", "8", "--batch-size", "4", "-q"]
    assert main(["extract", str(inp), "-o", str(tmp_path / "local"), *common]) == 0
    assert main(["extract", str(inp), "-o", str(tmp_path / "ray"), *common, "--ray", "--workers", "2"]) == 0
    assert_same_store(tmp_path / "local", tmp_path / "ray")
    capsys.readouterr()
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{"words": "not a list"}\n')
    lines = []
    for extra in ([], ["--ray", "--workers", "2"]):
        assert main(["extract", str(bad), "-o", str(tmp_path / "b"), "--debug", *extra]) == 2
        lines.append(capsys.readouterr().err.strip().splitlines())
        assert not (tmp_path / "b").exists()
    assert lines[0] == lines[1] and len(lines[0]) == 1 and str(bad) in lines[0][0]


def spy_on_ray(monkeypatch) -> dict:
    """Counts, filled in as a run goes: ``fold`` (passes folded on the Ray workers), ``on the
    workers`` (the analyses of the last one), ``units`` (merged units), ``maps`` (requests for
    maps to come back) and ``run_batch`` (batches run by an extractor in this process)."""
    from attnscope.extract.runner import Extractor
    from attnscope.on_ray import cluster as ray_mod

    calls = {"maps": 0, "run_batch": 0, "fold": 0}
    real_maps, real_run, real_fold = ray_mod.RayBatchRunner.maps, Extractor.run_batch, ray_mod.RayBatchRunner.fold

    def count(name, fn):
        def spy(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)
        return spy

    def fold(self, extractor, examples, analyses, *, on_unit, **kw):
        calls["fold"] += 1
        calls["on the workers"] = [a.name for a in analyses]

        def each(batches):
            calls["units"] = calls.get("units", 0) + 1
            on_unit(batches)
        return real_fold(self, extractor, examples, analyses, on_unit=each, **kw)

    monkeypatch.setattr(ray_mod.RayBatchRunner, "maps", count("maps", real_maps))
    monkeypatch.setattr(Extractor, "run_batch", count("run_batch", real_run))
    monkeypatch.setattr(ray_mod.RayBatchRunner, "fold", fold)
    return calls


def test_analyze_general_on_ray_folds_on_the_workers_and_equals_local(cluster, tmp_path, monkeypatch):
    """`analyze general --ray --workers 2`: the maps analyses and Figure 1's keeper fold on the
    workers, gradient importance (debug:bert has a masked-LM head) runs in the driver over the
    token lists; results/general.json equals the single-process one, and no map came back
    (the driver's extractor never ran a batch nor asked the workers for maps)."""
    from attnscope.cli.main import main
    from attnscope.families import general
    from attnscope.on_ray import cluster as ray_mod

    inp = tmp_path / "in.json"
    inp.write_text(json.dumps([e.to_dict() for e in corpus(40, seed=2)]))
    common = [str(inp), "-m", "debug:bert", "--batch-size", "4", "-q"]
    drawn = []  # Figure 1's example, as each run hands it to the report
    real_write = general.write_general

    def write_general(results, out_dir, *, example_map, **kw):
        drawn.append(example_map)
        return real_write(results, out_dir, example_map=example_map, **kw)

    monkeypatch.setattr(general, "write_general", write_general)
    assert main(["analyze", "general", *common, "-o", str(tmp_path / "local")]) == 0
    monkeypatch.setattr(ray_mod, "UNIT_EXAMPLES", 8)  # 5 units of 2 batches: merged in unit order
    calls = spy_on_ray(monkeypatch)
    assert main(["analyze", "general", *common, "-o", str(tmp_path / "ray"), "--ray", "--workers", "2"]) == 0
    assert calls == {"maps": 0, "run_batch": 0, "fold": 1, "units": 5,
                     "on the workers": ["relative-position", "special-tokens", "entropy",
                                        "head-distances", "figure-1-example"]}
    a, b = (json.loads((tmp_path / d / "results" / "general.json").read_text()) for d in ("local", "ray"))
    assert sorted(a["analyses"]) == ["entropy", "gradient-importance", "head-distances",
                                     "relative-position", "special-tokens"]
    assert a["analyses"]["relative-position"]["meta"]["examples"] == 40
    assert_same_result(a["analyses"], b["analyses"])
    assert_same_result(_without_times(a), _without_times(b))
    assert len(drawn) == 2 and drawn[0].index == drawn[1].index
    np.testing.assert_array_equal(drawn[0].attn, drawn[1].attn)


@pytest.mark.slow  # about 50 s here: two syntax runs with their figures
def test_analyze_syntax_on_ray_scores_the_heads_on_the_workers(cluster, debug_bert, tmp_path, monkeypatch):
    """Syntax without --train: DependencyHeads folds on the workers; same results/syntax.json."""
    from attnscope.on_ray import cluster as ray_mod
    from attnscope.pipeline import demo_inputs, run_family

    deps = {"deps": demo_inputs()["deps"]}
    monkeypatch.setattr(ray_mod, "UNIT_EXAMPLES", 4)  # 12 sentences in 3 units
    run_family("syntax", deps, tmp_path / "local", model=debug_bert)
    folds = []
    real_fold = ray_mod.RayBatchRunner.fold

    def spy(self, extractor, examples, analyses, **kw):
        folds.append([a.name for a in analyses])
        return real_fold(self, extractor, examples, analyses, **kw)

    monkeypatch.setattr(ray_mod.RayBatchRunner, "fold", spy)
    run_family("syntax", deps, tmp_path / "ray", model=debug_bert, ray=True, workers=2)
    assert folds == [["dependency-heads"]]
    a, b = (json.loads((tmp_path / d / "results" / "syntax.json").read_text()) for d in ("local", "ray"))
    assert_same_result(_without_times(a), _without_times(b))


def test_analyze_coref_on_ray_folds_the_antecedents_on_the_workers(cluster, tmp_path, monkeypatch):
    """`analyze coref --ray --workers 2`: CorefAntecedents folds on the workers (one fold over
    4 units; no map of the pass comes back), the examples figure's few windows are made there
    too (one request for maps, none run in the driver); results/coref.json, its figure panels
    included, equals the single-process one."""
    from attnscope.cli.main import main
    from attnscope.on_ray import cluster as ray_mod
    from attnscope.pipeline import demo_inputs

    text = demo_inputs()["coref"].read_text(encoding="utf-8")
    corpus_file = tmp_path / "coref.conllu"  # 4 copies of the 2 demo documents: 8 windows
    corpus_file.write_text("".join(text.replace("newdoc id = ", f"newdoc id = copy{k}-").rstrip("\n") + "\n\n"
                                   for k in range(4)), encoding="utf-8")
    common = ["analyze", "coref", str(corpus_file), "-m", "debug:bert", "--batch-size", "2", "-q"]
    assert main([*common, "-o", str(tmp_path / "local")]) == 0
    monkeypatch.setattr(ray_mod, "UNIT_EXAMPLES", 2)
    calls = spy_on_ray(monkeypatch)
    assert main([*common, "-o", str(tmp_path / "ray"), "--ray", "--workers", "2"]) == 0
    assert calls == {"fold": 1, "on the workers": ["coref-antecedents"], "units": 4, "maps": 1,
                     "run_batch": 0}
    a, b = (json.loads((tmp_path / d / "results" / "coref.json").read_text()) for d in ("local", "ray"))
    assert a["meta"]["extract"]["examples_out"] == 8 and a["meta"]["windows"]["documents"] == 8
    assert len(a["meta"]["examples"]) == 3  # the figure's panels, from maps made on the workers
    assert_same_result(_without_times(a), _without_times(b))


def test_the_ray_executor_returns_the_maps_of_any_extractor_in_plan_order(cluster, debug_bert):
    """Maps that come back (a store written under --ray): the forward passes run on the workers
    and the maps come back in plan order (``RayExecutor.batches``), the same as a local run's."""
    from attnscope.executor import executor
    from attnscope.extract.runner import Extractor

    exs, opts = corpus(20, seed=4), ExtractOptions(batch_size=3)
    local = [m for b in extract(exs, debug_bert, options=opts) for m in b]
    with executor(ray=True, workers=2) as ex:
        assert ex.name == "ray"
        remote = [m for _, b in ex.batches(Extractor(debug_bert, opts), exs) for m in b]
    assert [m.index for m in remote] == [m.index for m in local]
    for x, y in zip(local, remote):
        np.testing.assert_array_equal(x.attn, y.attn)


def test_the_figure1_keeper_merges_to_the_choice_of_one_pass(debug_bert):
    """Merged in any order, per-batch keepers choose what one keeper over every batch chooses:
    here (no example fits in 0 units) the shortest example, the lowest index among equals."""
    from attnscope.analyses.figure_example import Figure1Example
    batches = list(extract(corpus(30, seed=6, longest=4), debug_bert, options=ExtractOptions(batch_size=4)))
    expected = min((m.num_units, m.index) for b in batches for m in b)
    assert sum(m.num_units == expected[0] for b in batches for m in b) > 1  # a tie to break
    for order in (batches, batches[::-1], batches[1::2] + batches[::2]):
        merged = Figure1Example(max_units=0)
        for b in order:
            k = Figure1Example(max_units=0)
            k.update(b)
            merged.merge(k)
        assert (merged.best.num_units, merged.best.index) == expected
    assert Figure1Example().merge(Figure1Example()).best is None


def _without_times(d):
    if isinstance(d, dict):
        return {k: _without_times(v) for k, v in d.items()
                if not any(w in k for w in ("seconds", "elapsed", "time"))}
    if isinstance(d, list):
        return [_without_times(v) for v in d]
    return d


@pytest.mark.slow
def test_streaming_long_context_statistics_merge_exactly(cluster):
    from attnscope.analyses.longctx import LongContextStats
    from attnscope.engines.streaming import stream_stats
    from attnscope.models import load_model
    from attnscope.on_ray.cluster import stream_stats_on_ray

    lm = load_model("debug:llama")
    rng = random.Random(3)
    seqs = [[rng.randrange(5, 200) for _ in range(rng.randint(20, 60))] for _ in range(9)]
    local, remote = LongContextStats(), LongContextStats()
    stream_stats(lm, seqs, local, chunk=16)
    stream_stats_on_ray(lm, seqs, remote, workers=2, chunk=16, per_unit=2)
    assert remote.documents == local.documents == 9 and remote.tokens == local.tokens
    assert_same_result(local.finalize().arrays, remote.finalize().arrays)


@pytest.mark.slow
def test_analyze_longctx_on_ray_streams_on_the_workers_and_equals_local(cluster, tmp_path):
    """`analyze longctx --ray --workers 2 --longctx-engine streaming`: the statistics are folded on the
    workers (meta.ray_workers) and results/longctx.json's arrays equal the local run's."""
    from attnscope.cli.main import main

    doc = tmp_path / "docs.txt"
    words = [w for w in "the cat sat on a mat while it rained and a dog ran to the park".split()]
    doc.write_text("\n\n".join(" ".join(words[i:] + words[:i]) * 3 for i in range(6)) + "\n")
    common = [str(doc), "-m", "debug:llama", "--longctx-engine", "streaming", "--longctx-induction", "2",
              "--longctx-induction-length", "16", "-q"]
    assert main(["analyze", "longctx", *common, "-o", str(tmp_path / "local")]) == 0
    assert main(["analyze", "longctx", *common, "-o", str(tmp_path / "ray"), "--ray", "--workers", "2"]) == 0
    local, on_ray = (json.loads((tmp_path / d / "results" / "longctx.json").read_text())
                     for d in ("local", "ray"))
    assert local["meta"]["ray_workers"] == 0 and on_ray["meta"]["ray_workers"] == 2
    assert set(local["arrays"]) == set(on_ray["arrays"]) and local["arrays"]
    for name, arr in local["arrays"].items():
        want, got = np.array(arr["data"], dtype=float), np.array(on_ray["arrays"][name]["data"], dtype=float)
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12, equal_nan=True, err_msg=name)


def test_a_killed_worker_still_ends_in_the_same_store_and_results(cluster, debug_bert, tmp_path):
    """kill -9 of the actor's process in the middle of a unit: Ray Data starts a new actor and
    runs the unit again (Ray 2.60 retries without limit); the store and results are identical."""
    from attnscope.on_ray.cluster import extract_on_ray

    exs = corpus(60, seed=5)
    opts = ExtractOptions(batch_size=4)
    extract_to_store(exs, tmp_path / "local", debug_bert, options=opts, shard_size=8)
    expected = run_pass(open_store(tmp_path / "local"), map_analyses(debug_bert, False)).results
    killer = KillOnce(31, str(tmp_path / "killed"))
    out = extract_on_ray(exs, tmp_path / "ray", debug_bert, options=opts, shard_size=8, workers=2,
                         analyses=[*map_analyses(debug_bert, False), killer])
    assert (tmp_path / "killed").exists()  # the worker really was killed
    assert_same_store(tmp_path / "local", tmp_path / "ray")
    assert_same_results(expected, out.analyses[:-1])


@pytest.mark.slow
def test_a_killed_driver_leaves_a_store_that_resume_completes_identically(cluster, debug_bert, tmp_path):
    from attnscope.on_ray.cluster import extract_on_ray
    from attnscope.sources import open_input_store

    exs = corpus(600, seed=7, longest=60)
    inp = tmp_path / "in.json"
    inp.write_text(json.dumps([e.to_dict() for e in exs]))
    args = ["--debug", "--shard-size", "8", "--batch-size", "4", "-q"]
    env = dict(os.environ, PYTHONPATH=str(SRC), OMP_NUM_THREADS="1",
               RAY_ADDRESS=cluster.get_runtime_context().gcs_address)
    proc = subprocess.Popen([sys.executable, "-m", "attnscope", "extract", str(inp), "-o",
                             str(tmp_path / "ray"), *args, "--ray", "--workers", "2"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    shards = tmp_path / "ray" / "shards"
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and proc.poll() is None:
        if shards.is_dir() and len(list(shards.glob("*.safetensors"))) >= 3:
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the extraction ended before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    with pytest.raises(AttnscopeError, match="unfinished store"):
        open_input_store(tmp_path / "ray")
    extract_to_store(exs, tmp_path / "local", debug_bert, options=ExtractOptions(batch_size=4), shard_size=8)
    out = extract_on_ray(exs, tmp_path / "ray", debug_bert, options=ExtractOptions(batch_size=4),
                         shard_size=8, workers=2, resume=True)
    assert out.units_run < out.units  # the shards written before the kill were kept
    assert_same_store(tmp_path / "local", tmp_path / "ray")


# -- analyses that misbehave on purpose (shipped to the workers by value) -------------------

class RefuseExample(Entropy):
    """Entropy that refuses one example, as a reader refuses a bad input line."""

    name = "test-refuse"

    def __init__(self, index: int):
        super().__init__()
        self.index = index

    def update(self, batch):
        for m in batch:
            if m.index == self.index:
                raise AttnscopeError(f"example {m.index}: refused by the test analysis")
        super().update(batch)


class KillOnce(Entropy):
    """Kills its own worker process (SIGKILL) the first time it sees example ``index``."""

    name = "test-kill"

    def __init__(self, index: int, marker: str):
        super().__init__()
        self.index, self.marker = index, marker

    def update(self, batch):
        for m in batch:
            if m.index == self.index and not os.path.exists(self.marker):
                Path(self.marker).touch()
                os.kill(os.getpid(), signal.SIGKILL)
        super().update(batch)


try:  # the workers cannot import this test module: send these classes by value
    import ray.cloudpickle as _cp

    _cp.register_pickle_by_value(sys.modules[__name__])
except ImportError:
    pass


def test_analyze_patterns_on_ray_folds_on_the_workers_and_equals_local(cluster, tmp_path, monkeypatch):
    """`analyze patterns --ray --workers 2` (debug:llama, so key concentration runs too): the maps
    analyses fold on the workers through run_pass, key concentration (an encoded analysis that
    reads the k hook) runs in the driver; results/patterns.json equals the single-process one."""
    from attnscope.cli.main import main
    from attnscope.on_ray import cluster as ray_mod

    inp = tmp_path / "in.json"
    inp.write_text(json.dumps([e.to_dict() for e in corpus(24, seed=5)]))
    common = [str(inp), "-m", "debug:llama", "--batch-size", "4", "-q"]
    assert main(["analyze", "patterns", *common, "-o", str(tmp_path / "local")]) == 0
    calls: dict = {}
    real_fold = ray_mod.RayBatchRunner.fold

    def fold(self, extractor, examples, analyses, *, on_unit, **kw):
        calls["on the workers"] = [a.name for a in analyses]
        return real_fold(self, extractor, examples, analyses, on_unit=on_unit, **kw)

    monkeypatch.setattr(ray_mod.RayBatchRunner, "fold", fold)
    assert main(["analyze", "patterns", *common, "-o", str(tmp_path / "ray"), "--ray", "--workers", "2"]) == 0
    assert calls["on the workers"] and "key-concentration" not in calls["on the workers"]
    a, b = (json.loads((tmp_path / d / "results" / "patterns.json").read_text()) for d in ("local", "ray"))
    assert "key-concentration" in json.dumps(a)  # the driver-side analysis ran and was kept
    # key concentration rides on the maps pass here but runs its own forward pass on Ray: its
    # float32 keys agree to about 1e-9 relative (1.6e-9 measured), not bit for bit
    keys = {k for k in a["tables"] if "key" in k}
    assert keys and "keys" in a and a["analyses"].keys() == b["analyses"].keys()
    strip = ("tables", "analyses", "summary", "findings", "keys")
    assert_same_result(_without_times({k: v for k, v in a.items() if k not in strip}),
                       _without_times({k: v for k, v in b.items() if k not in strip}))
    for name in a["analyses"]:
        (_close if name == "key-concentration" else assert_same_result)(
            a["analyses"][name], b["analyses"][name], name)
    for name in a["tables"]:
        (_close if name in keys else assert_same_result)(a["tables"][name], b["tables"][name], name)
    _close(a["keys"], b["keys"], "keys")


def _close(a, b, where: str) -> None:
    """Equal but for floats, which agree to 1e-7 relative."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), where
        for k in a:
            _close(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _close(x, y, f"{where}[{i}]")
    elif isinstance(a, float):
        assert b == pytest.approx(a, rel=1e-7, nan_ok=True), where
    else:
        assert a == b, where


@pytest.mark.slow
def test_the_atlas_runs_its_tasks_on_the_workers_and_equals_local(cluster, tmp_path, monkeypatch):
    """`analyze atlas --ray`: every calibration and sweep task runs on the workers (the driver's
    own steps are made to fail) and the curve, the areas and the scores equal the local run's."""
    from importlib.resources import files

    from attnscope.analyses import atlas as A
    from attnscope.pipeline import run_family

    text = str(files("attnscope") / "demo_data" / "text.txt")
    opts = dict(model="debug:llama", max_seq_len=96, atlas_tasks=4, atlas_calibration=2, atlas_random=1,
                atlas_bootstrap=100, atlas_fractions="0,0.5,1", atlas_scores="streaming,snapkv",
                atlas_probes=0)
    run_family("atlas", {"atlas": text}, tmp_path / "local", **opts)

    def here(*args, **kwargs):
        raise AssertionError("a task step ran in the driver")

    monkeypatch.setattr(A.CalibrationStep, "__call__", here)
    monkeypatch.setattr(A.SweepStep, "__call__", here)
    run_family("atlas", {"atlas": text}, tmp_path / "ray", ray=True, workers=2, **opts)
    local, on_ray = (json.loads((tmp_path / d / "results" / "atlas.json").read_text()) for d in ("local", "ray"))
    for table in ("curve", "areas", "heads"):
        assert local["tables"][table] == on_ray["tables"][table], table
