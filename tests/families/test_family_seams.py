"""The seams of the family layer, each tested on what the real producer writes.

- ``attnscope run`` on a model folder that has a masked-LM head makes Figure 3 and its table
  (and says why Figure 3 is missing for a folder without one);
- ``attnscope serve`` reads the results folder that ``run`` wrote: per-head statistics and a
  clustering scatter with every head;
- ``attnscope analyze <family>`` exists for every registered family, with the family's options.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from attnscope.cli.main import main

TEXT = ("The fisherman mended his nets by the harbour.\nGulls circled above the boats.\n"
        "Later the tide came in.\n\nA second document has one more line.\nIt ends here.\n")


def _model_folder(path, mlm_head: bool):
    from attnscope.models.debug import build_debug_model

    lm = build_debug_model("bert", mlm_head=mlm_head)
    lm.model.save_pretrained(path)
    lm.tokenizer.save_pretrained(path)
    return path, lm


@pytest.fixture(scope="module")
def run_with_head(tmp_path_factory):
    root = tmp_path_factory.mktemp("seams")
    folder, lm = _model_folder(root / "mlm-model", mlm_head=True)
    (root / "text.txt").write_text(TEXT)
    out = root / "out"
    assert main(["run", "--model", str(folder), "--text", str(root / "text.txt"), "--out", str(out),
                 "--save-maps", "--quiet"]) == 0
    return out, lm


@pytest.mark.heavy
def test_run_with_a_masked_lm_head_makes_figure3_and_its_table(run_with_head):
    out, lm = run_with_head
    for ext in ("png", "svg"):
        assert (out / "figures" / f"figure3_gradients.{ext}").is_file()
    rows = json.loads((out / "tables" / "gradient_importance.json").read_text())
    assert [r["layer"] for r in rows] == list(range(lm.num_layers))
    assert all(r["separator"] is not None and r["separator"] >= 0 for r in rows)
    res = json.loads((out / "results" / "general.json").read_text())
    grad = res["analyses"]["gradient-importance"]
    assert grad["params"]["scorer"]["head"] == "pretrained"  # the folder's own head, nothing fitted
    html = (out / "report.html").read_text()
    assert "figure3_gradients" in html


@pytest.mark.heavy
def test_run_without_a_head_says_why_figure3_is_missing(tmp_path):
    folder, _ = _model_folder(tmp_path / "plain-model", mlm_head=False)
    (tmp_path / "text.txt").write_text(TEXT)
    out = tmp_path / "out"
    assert main(["run", "--model", str(folder), "--text", str(tmp_path / "text.txt"), "--out", str(out),
                 "--quiet"]) == 0
    assert not (out / "figures" / "figure3_gradients.png").exists()
    findings = json.loads((out / "results" / "general.json").read_text())["findings"]
    assert any("no masked-LM head" in f and "--general-gradients fit-head" in f for f in findings)


def test_results_files_are_strict_json(run_with_head):
    out, _ = run_with_head
    def refuse(constant):
        raise AssertionError(f"not strict JSON: {constant}")

    paths = [out / "results.json", *sorted((out / "results").glob("*.json")),
             *sorted((out / "run").glob("*.json"))]
    assert len(paths) >= 4
    for path in paths:
        json.loads(path.read_text(), parse_constant=refuse)


def test_serve_reads_what_run_wrote(run_with_head):
    from attnscope.serve.app import create_app

    out, lm = run_with_head
    L, H = lm.num_layers, lm.num_heads
    client = create_app(out / "maps" / "general", out).test_client()
    assert client.get("/api/info").get_json()["has_results"]
    got = client.get("/api/results").get_json()
    assert got["problems"] == []
    points = got["scatter"]["points"]
    assert sorted((p["layer"], p["head"]) for p in points) == [(la, h) for la in range(L) for h in range(H)]
    rows = json.loads((out / "tables" / "general_heads.json").read_text())
    by_head = {(r["layer"], r["head"]): r for r in rows}
    for p in points:  # the scatter is the clustering's MDS placement and behaviour labels
        r = by_head[(p["layer"], p["head"])]
        assert p["x"] == pytest.approx(r["mds_x"]) and p["y"] == pytest.approx(r["mds_y"])
        assert p["label"] == r["behaviour"]
    stats = {s["name"]: np.array(s["values"], dtype=float) for s in got["stats"]}
    prev = stats["general: general_heads.previous"]
    assert prev.shape == (L, H)
    np.testing.assert_allclose(prev, [[by_head[(la, h)]["previous"] for h in range(H)] for la in range(L)])


def test_analyze_command_for_every_registered_family(capsys):
    import dataclasses

    import typer

    from attnscope.cli.families import option_flag
    from attnscope.cli.main import app
    from attnscope.families import load_families

    root = typer.main.get_command(app)

    def flags(command) -> set[str]:
        return {o for p in command.params for o in getattr(p, "opts", [])}

    run_flags = flags(root.commands["run"])
    for fam in load_families():
        assert main(["analyze", fam.key, "--help"]) == 0
        assert fam.help.split()[0] in capsys.readouterr().out
        analyze_flags = flags(root.commands["analyze"].commands[fam.key])
        for f in dataclasses.fields(fam.Options):
            assert option_flag(fam, f) in analyze_flags and option_flag(fam, f) in run_flags, (fam.key, f.name)
        for inp in fam.inputs:
            assert inp.flag in run_flags


def test_bad_choice_names_the_flag(tmp_path, capsys):
    (tmp_path / "t.txt").write_text(TEXT)
    rc = main(["analyze", "coref", str(tmp_path / "t.txt"), "--coref-window", "wide", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert rc == 2 and "--coref-window" in err and "Traceback" not in err
    assert not (tmp_path / "o").exists()


@pytest.mark.slow
def test_demo_report_says_its_sample_is_too_small(tmp_path, default_model):
    """The demo's numbers rest on a few dozen items: the report says so itself (from the counts
    and interval widths), and Table 1 still lists the sample's frequent relations."""
    from attnscope.pipeline import demo_config, run_pipeline

    out = run_pipeline(demo_config(), tmp_path / "demo", model=default_model)
    fams = out.results_json["families"]
    for key in ("general", "syntax", "coref"):
        assert any(f.startswith("Caution:") for f in fams[key]["section"]["findings"]), key
    table1 = json.loads((tmp_path / "demo" / "tables" / "table1_syntax.json").read_text())
    assert len([r for r in table1 if r["relation"] != "all"]) >= 3
    assert all(r["count"] >= 5 for r in table1)
    html = (tmp_path / "demo" / "report.html").read_text()
    assert "too wide for these numbers" in html
    held = json.loads((tmp_path / "demo" / "tables" / "table2_coref_heldout.json").read_text())
    assert [(r["selected_on"], r["scored_on"]) for r in held if r["candidates"] == "mentions"] == [
        ("even documents", "odd documents"), ("odd documents", "even documents")]


def test_an_unfinished_store_is_refused(tmp_path, capsys, debug_bert):
    """A store whose extraction was killed would give numbers over part of a corpus. The store
    is what an interrupted extraction leaves: its first shard written, the manifest still
    "incomplete"."""
    from attnscope.data.io import example_from_dict
    from attnscope.extract.runner import ExtractOptions
    from attnscope.jobs import extract_to_store

    store = tmp_path / "maps"

    def interrupt(done, tokens):  # Ctrl-C once the first batch is written
        raise KeyboardInterrupt

    examples = [example_from_dict({"text": t}, i) for i, t in enumerate(["the cat sat on the mat",
                                                                        "a dog ran to the house"])]
    with pytest.raises(KeyboardInterrupt):
        extract_to_store(examples, store, debug_bert, options=ExtractOptions(batch_size=1), shard_size=1,
                         progress=interrupt)
    manifest = json.loads((store / "manifest.json").read_text())
    assert manifest["status"] == "incomplete" and len(list((store / "shards").iterdir())) == 1
    rc = main(["analyze", "general", str(store), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.count("\n") == 0 and "unfinished store" in err and str(store) in err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("model", ["debug:bert", "debug:granitemoehybrid"])
def test_a_family_returns_its_results_file_typed_and_a_reader_gets_the_same(tmp_path, model):
    # issue 57: Family.run returned Any (a Section); now a FamilyResult read back from the file
    # the family wrote, the same object any reader of the folder gets
    from importlib.resources import files

    from attnscope.analyses.base import Result
    from attnscope.analyses.family_result import FamilyResult
    from attnscope.families import FAMILIES, Context, load_families
    from attnscope.models import load_model

    load_families()
    lm = load_model(model)
    fam = FAMILIES["general"]()
    options = fam.Options()
    ctx = Context(model=lm, out_dir=tmp_path, seed=3, max_seq_len=64, batch_size=4)
    text = files("attnscope") / "demo_data" / "text.txt"
    made = fam.run(fam.prepare({"text": text}, options, ctx), options, ctx)
    assert isinstance(made, FamilyResult) and made.section.key == "general"
    path = tmp_path / "results" / "general.json"
    assert made.path == path and made.family == "general"
    d = json.loads(path.read_text())
    assert set(made.analyses) == set(d["analyses"]) >= {"relative-position", "special-tokens", "entropy"}
    for name, part in d["analyses"].items():
        for k, v in Result.from_json(part).arrays.items():
            np.testing.assert_array_equal(made.array(k, name), v)
    assert made.stats == tuple(d["stats"]) and {s["name"] for s in made.stats} >= {"previous", "entropy"}
    assert made.tables["general_heads"] == d["tables"]["general_heads"]
    assert made.model["name"] == model and made.provenance["seed"] == 3
    assert made.layers == ((1,) if "hybrid" in model else (0, 1))  # the model's own layers with attention
    again = FamilyResult.read(tmp_path, "general")
    assert again.section is None and again.body == made.body
    with pytest.raises(Exception, match=r"general.json \(entropy\): no array 'nope' \(it has .*entropy"):
        made.array("nope", "entropy")
