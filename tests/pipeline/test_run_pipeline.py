"""``run_pipeline`` with the real general and syntax families on a tiny random BERT.

These tests check the pipeline's own job: inputs, order, checkpoints, resuming, the report,
results.json and provenance, on what the real families write. The only stand-ins: a family
whose optional extra is "not installed" (``NotInstalled``), and a kill in the middle of a
family (``Calls.fail``: its ``run`` raises KeyboardInterrupt as it starts), which no real
input can cause.
"""

from __future__ import annotations

import hashlib
import json
import re

import numpy as np
import pytest
from conftest import one_line, says, weights_tolerance

import attnscope.pipeline as pipeline
from attnscope.errors import AttnscopeError, InputError
from attnscope.families import load_families
from attnscope.families.coref import Coref
from attnscope.families.general import General
from attnscope.families.syntax import Syntax
from attnscope.pipeline import RunConfig, run_pipeline
from attnscope.report.html import network_references
from tests.pipeline.test_faults_run import _stable  # a results file without its times

TEXT = ("The cat sat on the mat.\nIt was warm there.\nThe dog watched it.\n\n"
        "A second document starts here.\nIt has two sentences.\n")
DEPS = ("1\tThe\tthe\tDET\tDT\t_\t2\tdet\t_\t_\n2\tcat\tcat\tNOUN\tNN\t_\t3\tnsubj\t_\t_\n"
        "3\tsat\tsit\tVERB\tVBD\t_\t0\troot\t_\t_\n\n"
        "1\tDogs\tdog\tNOUN\tNNS\t_\t2\tnsubj\t_\t_\n2\tbark\tbark\tVERB\tVBP\t_\t0\troot\t_\t_\n\n")


class Calls:
    def __init__(self):
        self.count = {}
        self.fail = set()


def _counted(base, calls):
    """The real family ``base``, counting its runs; one whose key is in ``calls.fail`` is
    killed (KeyboardInterrupt) as it starts."""
    class Counted(base):
        def run(self, prepared, options, ctx):
            calls.count[self.key] = calls.count.get(self.key, 0) + 1
            if self.key in calls.fail:
                raise KeyboardInterrupt  # stands for a kill in the middle of the family
            return super().run(prepared, options, ctx)

    return Counted


class NotInstalled(Coref):
    def unavailable(self):
        return "its optional extra is not installed"


def use_families(monkeypatch, *families):
    monkeypatch.setattr(pipeline.config, "load_families", lambda: list(families))


@pytest.fixture
def fake(monkeypatch):
    calls = Calls()
    use_families(monkeypatch, _counted(General, calls), _counted(Syntax, calls), NotInstalled)
    return calls


@pytest.fixture
def inputs(tmp_path):
    (tmp_path / "in").mkdir()
    text = tmp_path / "in" / "text.txt"
    text.write_text(TEXT)
    deps = tmp_path / "in" / "deps.conllu"
    deps.write_text(DEPS)
    coref = tmp_path / "in" / "coref.conllu"
    coref.write_text("# newdoc id = d\n1\tIt\tit\tPRON\tPRP\t_\t2\tnsubj\t_\tEntity=(1)\n"
                     "2\tworks\twork\tVERB\tVBZ\t_\t0\troot\t_\t_\n\n")
    return {"text": text, "deps": deps, "coref": coref}


def _config(inputs, **kw):
    return RunConfig(model="debug:bert", text=inputs["text"], deps=inputs["deps"], **kw)


@pytest.mark.heavy
def test_every_promised_file_and_provenance(tmp_path, fake, inputs, debug_bert):
    out = tmp_path / "out"
    cfg = _config(inputs, coref=[inputs["coref"]])
    outcome = run_pipeline(cfg, out, command="attnscope run --out out", model=debug_bert)
    assert outcome.status == {"general": "done", "syntax": "done", "coref": "unavailable"}
    for table in ("general_heads", "table1_syntax"):
        for ext in ("csv", "md", "tex", "json"):
            assert (out / "tables" / f"{table}.{ext}").is_file()
    for figure in ("figure2_special_tokens", "figure_syntax_heatmap_all"):
        for ext in ("png", "svg"):
            assert (out / "figures" / f"{figure}.{ext}").is_file()
    assert outcome.report == out / "report.html" and outcome.results == out / "results.json"
    res = json.loads((out / "results.json").read_text())
    best = [h for key in ("general", "syntax") for h in res["families"][key]["section"]["best_heads"]]
    assert len(best) >= 1 and len(list((out / "views").glob("*.html"))) == len(best)  # a page per best head
    assert not (out / "maps").exists()  # only with save_maps
    prov = res["provenance"]
    assert prov["model"]["weights_sha256"] == debug_bert.weights_hash
    by_role = {d["role"]: d for d in prov["data"]}
    assert by_role["text"]["sha256"] == hashlib.sha256(inputs["text"].read_bytes()).hexdigest()
    assert by_role["deps"]["bytes"] == len(DEPS.encode())
    assert prov["arguments"]["seed"] == 0 and prov["seeds"]["run"] == 0 and set(prov["seeds"].values()) == {0}
    assert prov["command"] == "attnscope run --out out"
    assert {"attnscope", "torch", "transformers", "numpy"} <= set(prov["versions"])
    assert prov["elapsed_s"] > 0
    # results.json holds each family's results file and its section (tables with numbers).
    assert res["results"]["general"]["tables"]["general_heads"][0]["name"] == "1-1"
    assert res["results"]["general"] == json.loads((out / "results" / "general.json").read_text())
    table1 = res["families"]["syntax"]["section"]["tables"][0]
    assert table1["name"] == "table1_syntax" and table1["rows"][0]["relation"] == "all"
    html = (out / "report.html").read_text()
    for anchor in ("sec-general", "sec-syntax", "summary", "provenance"):
        assert f'id="{anchor}"' in html
    assert html.count('class="head-view"') == len(best)
    assert debug_bert.weights_hash in html
    # every family's input has its own rows (data), so none shows among the arguments, given or
    # not (the report once listed only the paper's four and printed patterns=default, ...)
    from attnscope.families import load_families
    from attnscope.report.html import _provenance_rows

    shown = next(r["value"] for r in _provenance_rows(prov) if r["name"] == "arguments")
    names = [inp.name for fam in load_families() for inp in fam.inputs]
    assert {"patterns", "attribution", "documents"} <= set(names)
    keys = {part.split("=", 1)[0] for part in shown.split(", ") if "=" in part}
    assert "seed" in keys and not keys & set(names), shown
    assert json.loads((out / "run" / "state.json").read_text())["status"] == "complete"


def test_numbers_match_an_independent_computation(tmp_path, fake, inputs, debug_bert):
    """The general family's previous-token table in results.json, recomputed here from scratch:
    per example sum_{i>=1} a[i, i-1] / (n - 1), then the mean over examples (section 3.1)."""
    from attnscope.data.unlabeled import prepare_unlabeled
    from attnscope.extract import extract

    out = tmp_path / "out"
    run_pipeline(RunConfig(model="debug:bert", text=inputs["text"]), out, model=debug_bert)
    exs = prepare_unlabeled(inputs["text"], debug_bert.tokenizer, max_seq_len=128, seed=0, num_examples=1000)
    maps = [m for b in extract(exs, debug_bert, max_seq_len=128) for m in b]
    per_example = [np.diagonal(m.attn.astype(float), offset=-1, axis1=2, axis2=3).mean(-1) for m in maps]  # [L H] each
    assert len(per_example) == 2
    got = json.loads((out / "results.json").read_text())["results"]["general"]["tables"]["general_heads"]
    # means of a weight of float32 softmax rows (the run's pass and this one) against float64
    np.testing.assert_allclose([r["previous"] for r in got], np.mean(per_example, axis=0).ravel(),
                               **weights_tolerance(max(m.attn.shape[-1] for m in maps)))


@pytest.mark.heavy
def test_no_file_refers_to_the_network(tmp_path, fake, inputs, debug_bert):
    out = tmp_path / "out"
    run_pipeline(_config(inputs), out, model=debug_bert)
    checked = 0
    for p in out.rglob("*"):
        if p.suffix in (".html", ".svg", ".json", ".md", ".csv", ".tex"):
            assert network_references(p.read_text(encoding="utf-8")) == [], p
            checked += 1
    assert checked >= 10
    text = re.sub(r"data:[a-z+/]+;base64,[A-Za-z0-9+/=]+", "", (out / "report.html").read_text())
    assert not re.search(r"https?:|ftp:", text, re.I)


@pytest.mark.heavy
def test_same_arguments_same_numbers(tmp_path, fake, inputs, debug_bert):
    a = run_pipeline(_config(inputs), tmp_path / "a", model=debug_bert).results_json
    b = run_pipeline(_config(inputs), tmp_path / "b", model=debug_bert).results_json
    assert _stable(a["results"]) == _stable(b["results"])
    assert _stable(a["families"]) == _stable(b["families"])


@pytest.mark.heavy
def test_interrupted_run_resumes_without_redoing_finished_families(tmp_path, fake, inputs, debug_bert):
    out = tmp_path / "out"
    fake.fail.add("syntax")
    with pytest.raises(KeyboardInterrupt) as stopped:
        run_pipeline(_config(inputs), out, model=debug_bert)
    assert fake.count == {"general": 1, "syntax": 1}
    assert not (out / "report.html").exists()
    state = json.loads((out / "run" / "state.json").read_text())
    assert (state["status"], state["finished"], state["running"]) == ("interrupted", ["general"], "syntax")
    # one line: the folder, what it keeps, and how to go on
    says(one_line(stopped.value), f"interrupted: {out} keeps general (finished)", "--resume")
    with pytest.raises(AttnscopeError) as refused:
        run_pipeline(_config(inputs), out, model=debug_bert)
    # the folder, that it holds a run, and the two ways on
    says(one_line(refused.value), f"{out}: ", "already holds a run", "resume", "overwrite")
    assert refused.value.params == ("resume", "overwrite")
    fake.fail.clear()
    outcome = run_pipeline(_config(inputs), out, resume=True, model=debug_bert)
    assert fake.count == {"general": 1, "syntax": 2}
    assert outcome.status == {"general": "resumed", "syntax": "done"}
    prov = outcome.results_json["provenance"]
    assert prov["analysis_time_s"] == pytest.approx(sum(prov["family_times_s"].values()), abs=0.01)
    html = outcome.report.read_text()
    assert 'id="sec-general"' in html and 'id="sec-syntax"' in html
    fresh = run_pipeline(_config(inputs), tmp_path / "fresh", model=debug_bert)
    # the resumed family's view links are kept
    assert html.count('class="head-view"') == fresh.report.read_text().count('class="head-view"') >= 1
    assert _stable(outcome.results_json["results"]) == _stable(fresh.results_json["results"])
    # Other arguments cannot resume this run; --overwrite starts again.
    with pytest.raises(AttnscopeError) as refused:
        run_pipeline(_config(inputs, seed=1), out, resume=True, model=debug_bert)
    says(one_line(refused.value), f"{out}: ", "cannot resume", "overwrite")
    assert refused.value.params == ("overwrite",)
    again = run_pipeline(_config(inputs, seed=1), out, overwrite=True, model=debug_bert)
    assert again.status == {"general": "done", "syntax": "done"}


def test_bad_input_names_file_and_line_and_writes_nothing(tmp_path, fake, inputs, debug_bert):
    bad = tmp_path / "in" / "bad.conllu"
    bad.write_text(DEPS + "1\tOops\toops\tNOUN\tNN\t_\tx\troot\t_\t_\n\n")
    out = tmp_path / "out"
    with pytest.raises(InputError) as err:
        run_pipeline(RunConfig(model="debug:bert", deps=bad), out, model=debug_bert)
    assert one_line(err.value).startswith(f"{bad}:8:")
    assert not out.exists()
    with pytest.raises(InputError) as err:
        run_pipeline(RunConfig(model="debug:bert", text=tmp_path / "missing.txt"), out, model=debug_bert)
    says(one_line(err.value), str(tmp_path / "missing.txt"), "no such file")
    assert not out.exists()


# the argument, the value given and what it may be; with nothing to do, the inputs to give
@pytest.mark.parametrize("kwargs,facts,params", [
    ({}, ("nothing to do", "--text", "--deps"), ()),
    ({"deps_train": "x"}, ("deps_train", "deps"), ("deps_train", "deps")),
    ({"text": "T", "gradients": "sometimes"}, ("gradients", "'sometimes'", "fit-head"), ("gradients",)),
    ({"text": "T", "window": "wide"}, ("window", "'wide'"), ("window",)),
    ({"text": "T", "max_seq_len": 2}, ("max_seq_len", "at least 8", "not 2"), ("max_seq_len",)),
])
def test_bad_arguments_are_refused(tmp_path, inputs, kwargs, facts, params):
    kwargs = {k: (inputs["text"] if v == "T" else v) for k, v in kwargs.items()}
    with pytest.raises(AttnscopeError) as e:
        run_pipeline(RunConfig(model="debug:bert", **kwargs), tmp_path / "out")
    says(one_line(e.value), *facts)
    assert e.value.params == params
    assert not (tmp_path / "out").exists()


def test_refuses_to_overwrite_a_folder_that_is_not_a_run(tmp_path, fake, inputs, debug_bert):
    out = tmp_path / "precious"
    out.mkdir()
    (out / "thesis.tex").write_text("years of work")
    for kw in ({}, {"overwrite": True}, {"resume": True}):
        with pytest.raises(AttnscopeError) as e:
            run_pipeline(_config(inputs), out, model=debug_bert, **kw)
        # the folder, what it holds (not a run; with overwrite, that it is not deleted), the argument
        cause = "not an attnscope run" if kw.get("overwrite") else "other files"
        says(one_line(e.value), f"{out}: ", cause, "out_dir")
        assert e.value.params == ("out_dir",)
    assert (out / "thesis.tex").read_text() == "years of work"


@pytest.mark.heavy
def test_unavailable_family_is_reported_not_fatal(tmp_path, monkeypatch, inputs, debug_bert):
    calls = Calls()
    use_families(monkeypatch, _counted(General, calls), NotInstalled)
    outcome = run_pipeline(RunConfig(model="debug:bert", text=inputs["text"], coref=[inputs["coref"]]),
                           tmp_path / "out", model=debug_bert)
    assert outcome.status == {"coref": "unavailable", "general": "done"}
    # the family's note: not available, and why (the family's own reason)
    note = outcome.notes[0]
    assert note["key"] == "coref"
    says(one_line(note["message"]), "not available", "its optional extra is not installed")
    html = outcome.report.read_text()
    assert 'id="note-coref"' in html and note["message"] in html


def test_registry_finds_every_family_module():
    """The families package is scanned: every module registers its family, in report order."""
    import pkgutil

    import attnscope.families as pkg

    modules = {m.name for m in pkgutil.iter_modules(pkg.__path__)} - {"base"}
    keys = [f.key for f in load_families()]
    assert keys[:3] == ["general", "syntax", "coref"] and set(keys) >= modules & {"general", "syntax", "coref"}
    assert len(keys) == len(set(keys)) >= len(modules)


def test_unknown_run_argument_is_refused():
    with pytest.raises(AttnscopeError) as e:
        RunConfig(text="t.txt", colour="red")
    says(one_line(e.value), "unknown", "colour", "text")  # the argument, and the known ones


@pytest.mark.heavy
def test_progress_has_an_overall_count_that_never_goes_back(tmp_path, fake, inputs, debug_bert):
    from attnscope.progress import unit_of

    seen = []
    run_pipeline(_config(inputs), tmp_path / "out", model=debug_bert,
                 progress=lambda step, done, total: seen.append((step, done, total)))
    overall = [(d, t) for s, d, t in seen if s == "overall"]
    assert overall and [d for d, _ in overall] == sorted(d for d, _ in overall)
    # seconds: re-estimated as the run goes, and the time taken when it ends
    assert all(t >= d for d, t in overall) and overall[-1][0] == overall[-1][1]
    assert {unit_of(s) for s, _, _ in seen if s == "overall"} == {"s"}
    steps = {s for s, _, _ in seen}
    assert {"load model", "prepare inputs", "report"} <= steps
    assert {s.split(": ")[0] for s in steps if ": " in s} == {"general", "syntax"}  # each family's own steps


def test_save_maps_is_passed_to_families(tmp_path, fake, inputs, debug_bert):
    """``save_maps``: the general family keeps its maps in maps/general, a complete store of
    the examples it analysed (the text makes two)."""
    from attnscope.store import open_store

    run_pipeline(RunConfig(model="debug:bert", text=inputs["text"], save_maps=True), tmp_path / "o",
                 model=debug_bert)
    store = open_store(tmp_path / "o" / "maps" / "general")
    assert store.complete and len(store) == 2 and store.num_layers == debug_bert.num_layers


@pytest.mark.heavy
def test_overwrite_with_bad_input_keeps_the_old_run(tmp_path, fake, inputs, debug_bert):
    out = tmp_path / "out"
    run_pipeline(_config(inputs), out, model=debug_bert)
    before = (out / "results.json").read_bytes()
    bad = tmp_path / "in" / "bad.conllu"
    bad.write_text("1\tA\ta\tDET\tDT\t_\t2\tdet\t_\t_\n2\tB\tb\tNOUN\tNN\t_\t1\tnsubj\t_\t_\n\n")
    with pytest.raises(InputError, match="cycle"):
        run_pipeline(RunConfig(model="debug:bert", deps=bad), out, overwrite=True, model=debug_bert)
    assert (out / "results.json").read_bytes() == before


def test_run_family_takes_what_python_has_read_and_refuses_the_rest(tmp_path, debug_bert):
    """``run_family`` is the one entry from Python too: examples already read give the numbers the
    same examples give from a file; anything else is one line naming what is wrong."""
    from attnscope.data.io import write_examples
    from attnscope.data.records import Example

    examples = [Example(text="the cat sat on the mat."), Example(text="a dog ran.", text_pair="it was red.")]
    write_examples(examples, tmp_path / "in.json")
    common = dict(model=debug_bert, max_seq_len=32, gradients="off")
    pipeline.run_family("general", {"text": examples}, tmp_path / "mem", **common)
    pipeline.run_family("general", {"text": tmp_path / "in.json"}, tmp_path / "file", **common)
    mem, file = (json.loads((tmp_path / d / "tables" / "general_heads.json").read_text()) for d in ("mem", "file"))
    assert mem == file and len(mem) == 4  # 2 layers x 2 heads
    with pytest.raises(AttnscopeError) as refused:
        pipeline.run_family("general", {"text": examples}, tmp_path / "x", engine="maps", **common)
    assert refused.value.params == ("engine",) and "general_engine" in str(refused.value)
    with pytest.raises(AttnscopeError) as refused:
        pipeline.run_family("general", {"text": ["the cat sat."]}, tmp_path / "x", **common)
    assert "Example" in str(refused.value) and "str" in str(refused.value)  # what it takes, what it got
    with pytest.raises(AttnscopeError) as refused:  # a family with a reader of its own takes files
        pipeline.run_family("longctx", {"documents": examples}, tmp_path / "x", model=debug_bert)
    assert refused.value.params == ("documents",) and "list" in str(refused.value)
    with pytest.raises(AttnscopeError) as refused:  # an input the family does not have, not dropped
        pipeline.run_family("syntax", {"deps": examples, "train": examples}, tmp_path / "x", model=debug_bert)
    says(one_line(refused.value), "syntax: no input 'train'", "its inputs: ")
    assert refused.value.params == ("train",)
    assert not (tmp_path / "x").exists()


def test_out_of_gpu_memory_in_a_run_is_one_line_naming_max_seq_len(tmp_path, capsys, monkeypatch, inputs):
    """``attnscope run`` as ``analyze``: torch's out-of-memory error (several lines of allocator
    advice) becomes one line naming --max-seq-len and what the pass needed, exit 2."""
    import torch

    from attnscope.cli.main import main

    def boom(self, prepared, options, ctx):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 3.00 GiB.\nOf the allocated ...")

    monkeypatch.setattr(General, "run", boom)
    code = main(["run", "--text", str(inputs["text"]), "--model", "debug:bert", "--max-seq-len", "64",
                 "--out", str(tmp_path / "out"), "-q"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1
    says(err, "--max-seq-len 64", "3.00 GiB", "GPU memory")


def test_the_arguments_recorded_are_those_of_the_families_that_run():
    """Provenance (and the resume fingerprint) hold the shared settings and the inputs and options
    of the families that run: a run of the general family alone listed 91 arguments, coref's
    window and the probes' epochs among them."""
    args = RunConfig(text="t.txt", window="sliding").as_dict()
    assert {"model", "seed", "max_seq_len", "text", "gradients"} <= set(args)
    assert not {"window", "deps", "coref", "deps_train"} & set(args), sorted(args)
    both = RunConfig(text="t.txt", coref=["c.conllu"], window="sliding").as_dict()
    assert both["window"] == "sliding" and both["coref"] == ["c.conllu"] and set(args) < set(both)
