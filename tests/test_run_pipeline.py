"""``run_pipeline`` with small stand-in analysis families (real extraction on a tiny model).

The stand-ins follow the pipeline contract exactly (write tables, figures and
``results/<family>.json`` under ``out_dir``, return a Section with best heads and their maps),
so these tests check the pipeline's own job: inputs, order, checkpoints, resuming, the
report, results.json and provenance, independently of the real families.
"""

from __future__ import annotations

import hashlib
import json
import re

import numpy as np
import pytest

import attnscope.pipeline as pipeline
from attnscope.errors import AttnscopeError, InputError
from attnscope.families import load_families
from attnscope.families.coref import Coref
from attnscope.families.general import General
from attnscope.families.syntax import Syntax
from attnscope.pipeline import RunConfig, run_pipeline
from attnscope.report.html import network_references
from attnscope.report.section import FigureArtifact, Section, TableArtifact

TEXT = ("The cat sat on the mat.\nIt was warm there.\nThe dog watched it.\n\n"
        "A second document starts here.\nIt has two sentences.\n")
DEPS = ("1\tThe\tthe\tDET\tDT\t_\t2\tdet\t_\t_\n2\tcat\tcat\tNOUN\tNN\t_\t3\tnsubj\t_\t_\n"
        "3\tsat\tsit\tVERB\tVBD\t_\t0\troot\t_\t_\n\n"
        "1\tDogs\tdog\tNOUN\tNNS\t_\t2\tnsubj\t_\t_\n2\tbark\tbark\tVERB\tVBP\t_\t0\troot\t_\t_\n\n")


class Calls:
    def __init__(self):
        self.count = {}
        self.fail = set()


def _head_means(batches, kind):
    """Per head: mean attention to the first unit (``general``) or the fraction of words whose
    most-attended word is their dependency head (``syntax``)."""
    num = den = 0
    for batch in batches:
        for m in batch:
            if kind == "general":
                num = num + m.attn[:, :, :, 0].sum(-1)  # [L H]
                den += m.attn.shape[2]
            else:
                pos = m.word_positions()
                heads = np.asarray(m.example.heads) - 1
                keep = heads >= 0
                sub = m.attn[:, :, pos][:, :, :, pos]  # [L H w w]
                pred = sub.argmax(-1)  # [L H w]
                num = num + (pred[:, :, keep] == heads[keep]).sum(-1)
                den += int(keep.sum())
    return num / den


def _fake_family(kind, calls):
    def run(examples, model, out_dir, *, progress=None, seed=0, max_seq_len=128, batch_size=16,
            save_maps=None, **kwargs):
        from attnscope.analyses.base import Result
        from attnscope.extract import extract
        from attnscope.report.figures import new_figure, save_figure
        from attnscope.report.tables import write_table

        calls.count[kind] = calls.count.get(kind, 0) + 1
        if kind in calls.fail:
            raise KeyboardInterrupt  # stands for a kill in the middle of the family
        batches = list(extract(examples, model, word_level=kind == "syntax", max_seq_len=max_seq_len,
                               batch_size=batch_size, seed=seed))
        for i, _ in enumerate(batches):
            if progress is not None:
                progress("extract", i + 1, len(batches))
        score = _head_means(batches, kind)  # [L H]
        rows = [{"layer": la, "head": h, "name": f"{la + 1}-{h + 1}", "score": float(score[la, h])}
                for la in range(score.shape[0]) for h in range(score.shape[1])]
        cols = ["name", "score"]
        paths = write_table(rows, out_dir / "tables" / f"{kind}_heads", columns=cols, caption=kind)
        fig, ax = new_figure(figsize=(2, 2))
        ax.imshow(score)
        figs = save_figure(fig, out_dir / "figures" / f"{kind}_heads")
        Result(kind, params={"seed": seed}, tables={"heads": rows}).save(out_dir / "results" / f"{kind}.json")
        best = max(rows, key=lambda r: r["score"])
        first = batches[0].items[0]
        return Section(key=kind, title=f"Stand-in {kind}", findings=[f"best head {best['name']}"],
                       tables=[TableArtifact(f"{kind}_heads", f"{kind} per head", rows, cols, paths)],
                       figures=[FigureArtifact(f"{kind}_heads", f"{kind} heatmap", figs)],
                       methods=[f"{kind}: a formula"], paper=[{"what": kind, "paper": 50.0, "ours": best["score"]}],
                       best_heads=[(best["layer"], best["head"], first.index, f"best {kind}")],
                       maps={first.index: first})

    return run


def _stand_in(base, fn):
    """The real family (its inputs, options and ``prepare``) with ``run`` replaced by ``fn``."""
    class StandIn(base):
        def run(self, prepared, options, ctx):
            data = prepared.data
            examples = data["source"].data if "source" in data else data["dev"]
            return fn(examples, ctx.model, ctx.out_dir, progress=ctx.progress, seed=ctx.seed,
                      max_seq_len=ctx.max_seq_len, batch_size=ctx.batch_size, save_maps=ctx.save_maps)

    return StandIn


class NotInstalled(Coref):
    def unavailable(self):
        return "its optional extra is not installed"


def use_families(monkeypatch, *families):
    monkeypatch.setattr(pipeline, "load_families", lambda: list(families))


@pytest.fixture
def fake(monkeypatch):
    calls = Calls()
    use_families(monkeypatch, _stand_in(General, _fake_family("general", calls)),
                 _stand_in(Syntax, _fake_family("syntax", calls)), NotInstalled)
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


def test_every_promised_file_and_provenance(tmp_path, fake, inputs, debug_bert):
    out = tmp_path / "out"
    cfg = _config(inputs, coref=[inputs["coref"]])
    outcome = run_pipeline(cfg, out, command="attnscope run --out out", model=debug_bert)
    assert outcome.status == {"general": "done", "syntax": "done", "coref": "unavailable"}
    for kind in ("general", "syntax"):
        for ext in ("csv", "md", "tex", "json"):
            assert (out / "tables" / f"{kind}_heads.{ext}").is_file()
        for ext in ("png", "svg"):
            assert (out / "figures" / f"{kind}_heads.{ext}").is_file()
    assert outcome.report == out / "report.html" and outcome.results == out / "results.json"
    assert len(list((out / "views").glob("*.html"))) == 2
    assert not (out / "maps").exists()  # only with save_maps
    res = json.loads((out / "results.json").read_text())
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
    assert res["results"]["general"]["tables"]["heads"][0]["name"] == "1-1"
    assert res["families"]["syntax"]["section"]["tables"][0]["rows"][0]["name"] == "1-1"
    html = (out / "report.html").read_text()
    for anchor in ("sec-general", "sec-syntax", "summary", "provenance"):
        assert f'id="{anchor}"' in html
    assert html.count('class="head-view"') == 2
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
    """The table the report shows is the stand-in's numbers, recomputed here from scratch."""
    from attnscope.extract import extract

    out = tmp_path / "out"
    run_pipeline(RunConfig(model="debug:bert", text=inputs["text"]), out, model=debug_bert)
    from attnscope.data.unlabeled import prepare_unlabeled

    exs = prepare_unlabeled(inputs["text"], debug_bert.tokenizer, max_seq_len=128, seed=0, num_examples=1000)
    total = np.zeros((2, 2))
    rows = 0
    for b in extract(exs, debug_bert, max_seq_len=128):
        for m in b:
            total += m.attn[:, :, :, 0].sum(-1)
            rows += m.attn.shape[2]
    got = json.loads((out / "results.json").read_text())["results"]["general"]["tables"]["heads"]
    np.testing.assert_allclose([r["score"] for r in got], (total / rows).ravel(), rtol=1e-6)


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


def test_same_arguments_same_numbers(tmp_path, fake, inputs, debug_bert):
    a = run_pipeline(_config(inputs), tmp_path / "a", model=debug_bert).results_json
    b = run_pipeline(_config(inputs), tmp_path / "b", model=debug_bert).results_json
    assert a["results"] == b["results"]
    assert a["families"] == b["families"]


def test_interrupted_run_resumes_without_redoing_finished_families(tmp_path, fake, inputs, debug_bert):
    out = tmp_path / "out"
    fake.fail.add("syntax")
    with pytest.raises(KeyboardInterrupt):
        run_pipeline(_config(inputs), out, model=debug_bert)
    assert fake.count == {"general": 1, "syntax": 1}
    assert not (out / "report.html").exists()
    assert json.loads((out / "run" / "state.json").read_text())["status"] == "running"
    with pytest.raises(AttnscopeError, match=r"already holds a run \(use resume to continue it") as refused:
        run_pipeline(_config(inputs), out, model=debug_bert)
    assert refused.value.params == ("resume", "overwrite")
    fake.fail.clear()
    outcome = run_pipeline(_config(inputs), out, resume=True, model=debug_bert)
    assert fake.count == {"general": 1, "syntax": 2}
    assert outcome.status == {"general": "resumed", "syntax": "done"}
    prov = outcome.results_json["provenance"]
    assert prov["analysis_time_s"] == pytest.approx(sum(prov["family_times_s"].values()), abs=0.01)
    html = outcome.report.read_text()
    assert 'id="sec-general"' in html and 'id="sec-syntax"' in html
    assert html.count('class="head-view"') == 2  # the resumed family's view links are kept
    fresh = run_pipeline(_config(inputs), tmp_path / "fresh", model=debug_bert).results_json
    assert outcome.results_json["results"] == fresh["results"]
    # Other arguments cannot resume this run; --overwrite starts again.
    with pytest.raises(AttnscopeError, match="cannot resume"):
        run_pipeline(_config(inputs, seed=1), out, resume=True, model=debug_bert)
    again = run_pipeline(_config(inputs, seed=1), out, overwrite=True, model=debug_bert)
    assert again.status == {"general": "done", "syntax": "done"}


def test_bad_input_names_file_and_line_and_writes_nothing(tmp_path, fake, inputs, debug_bert):
    bad = tmp_path / "in" / "bad.conllu"
    bad.write_text(DEPS + "1\tOops\toops\tNOUN\tNN\t_\tx\troot\t_\t_\n\n")
    out = tmp_path / "out"
    with pytest.raises(InputError) as err:
        run_pipeline(RunConfig(model="debug:bert", deps=bad), out, model=debug_bert)
    assert str(err.value).startswith(f"{bad}:8:")
    assert "\n" not in str(err.value)
    assert not out.exists()
    with pytest.raises(InputError, match="no such file"):
        run_pipeline(RunConfig(model="debug:bert", text=tmp_path / "missing.txt"), out, model=debug_bert)
    assert not out.exists()


@pytest.mark.parametrize("kwargs,message", [
    ({}, "nothing to do"),
    ({"deps_train": "x"}, "^deps_train needs deps$"),
    ({"text": "T", "gradients": "sometimes"}, "^gradients must be one of"),
    ({"text": "T", "window": "wide"}, "^window must be one of"),
    ({"text": "T", "max_seq_len": 2}, "^max_seq_len must be at least 8"),
])
def test_bad_arguments_are_refused(tmp_path, inputs, kwargs, message):
    kwargs = {k: (inputs["text"] if v == "T" else v) for k, v in kwargs.items()}
    with pytest.raises(AttnscopeError, match=message):
        run_pipeline(RunConfig(model="debug:bert", **kwargs), tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_refuses_to_overwrite_a_folder_that_is_not_a_run(tmp_path, fake, inputs, debug_bert):
    out = tmp_path / "precious"
    out.mkdir()
    (out / "thesis.tex").write_text("years of work")
    for kw in ({}, {"overwrite": True}, {"resume": True}):
        with pytest.raises(AttnscopeError, match="not an attnscope run|other files"):
            run_pipeline(_config(inputs), out, model=debug_bert, **kw)
    assert (out / "thesis.tex").read_text() == "years of work"


def test_unavailable_family_is_reported_not_fatal(tmp_path, monkeypatch, inputs, debug_bert):
    calls = Calls()
    use_families(monkeypatch, _stand_in(General, _fake_family("general", calls)), NotInstalled)
    outcome = run_pipeline(RunConfig(model="debug:bert", text=inputs["text"], coref=[inputs["coref"]]),
                           tmp_path / "out", model=debug_bert)
    assert outcome.status == {"coref": "unavailable", "general": "done"}
    assert "not available in this installation" in outcome.notes[0]["message"]
    html = outcome.report.read_text()
    assert 'id="note-coref"' in html and "not available in this installation" in html


def test_registry_finds_every_family_module():
    """The families package is scanned: every module registers its family, in report order."""
    import pkgutil

    import attnscope.families as pkg

    modules = {m.name for m in pkgutil.iter_modules(pkg.__path__)} - {"base"}
    keys = [f.key for f in load_families()]
    assert keys[:3] == ["general", "syntax", "coref"] and set(keys) >= modules & {"general", "syntax", "coref"}
    assert len(keys) == len(set(keys)) >= len(modules)


def test_unknown_run_argument_is_refused():
    with pytest.raises(AttnscopeError, match="unknown run argument.*colour"):
        RunConfig(text="t.txt", colour="red")


def test_progress_has_an_overall_count_that_never_goes_back(tmp_path, fake, inputs, debug_bert):
    seen = []
    run_pipeline(_config(inputs), tmp_path / "out", model=debug_bert,
                 progress=lambda step, done, total: seen.append((step, done, total)))
    overall = [(d, t) for s, d, t in seen if s == "overall"]
    assert [d for d, _ in overall] == sorted(d for d, _ in overall)
    # The total is the work estimate: examples built from the text plus dependency sentences.
    n_text = overall[-1][1] - 2
    assert overall[-1][0] == overall[-1][1] and n_text >= 1
    steps = {s for s, _, _ in seen}
    assert {"load model", "prepare inputs", "general: extract", "syntax: extract", "report"} <= steps


def test_save_maps_is_passed_to_families(tmp_path, monkeypatch, inputs, debug_bert):
    got = {}

    def general(examples, model, out_dir, *, save_maps=None, **kw):
        got["save_maps"] = save_maps
        return Section(key="general", title="g")

    use_families(monkeypatch, _stand_in(General, general))
    run_pipeline(RunConfig(model="debug:bert", text=inputs["text"], save_maps=True), tmp_path / "o",
                 model=debug_bert)
    assert got["save_maps"] == tmp_path / "o" / "maps" / "general"


def test_overwrite_with_bad_input_keeps_the_old_run(tmp_path, fake, inputs, debug_bert):
    out = tmp_path / "out"
    run_pipeline(_config(inputs), out, model=debug_bert)
    before = (out / "results.json").read_bytes()
    bad = tmp_path / "in" / "bad.conllu"
    bad.write_text("1\tA\ta\tDET\tDT\t_\t2\tdet\t_\t_\n2\tB\tb\tNOUN\tNN\t_\t1\tnsubj\t_\t_\n\n")
    with pytest.raises(InputError, match="cycle"):
        run_pipeline(RunConfig(model="debug:bert", deps=bad), out, overwrite=True, model=debug_bert)
    assert (out / "results.json").read_bytes() == before
