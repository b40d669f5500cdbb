"""``attnscope run`` end to end: the real command, the real analysis families, a tiny random model."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from attnscope.cli.main import main
from attnscope.pipeline import demo_inputs
from attnscope.report.html import network_references

TEXT = ("The fisherman mended his nets by the harbour.\nGulls circled above the boats.\n"
        "Later the tide came in.\n\nA second document has one more line.\nIt ends here.\n")


def _conllu(sentences):
    out = []
    for words in sentences:
        for i, (w, h, r, u) in enumerate(words, 1):
            out.append(f"{i}\t{w}\t{w.lower()}\t{u}\t_\t_\t{h}\t{r}\t_\t_")
        out.append("")
    return "\n".join(out) + "\n"


TRAIN = _conllu([
    [("The", 2, "det", "DET"), ("dog", 3, "nsubj", "NOUN"), ("slept", 0, "root", "VERB"), (".", 3, "punct", "PUNCT")],
    [("A", 2, "det", "DET"), ("bird", 3, "nsubj", "NOUN"), ("sang", 0, "root", "VERB"), (".", 3, "punct", "PUNCT")],
    [("We", 2, "nsubj", "PRON"), ("saw", 0, "root", "VERB"), ("the", 4, "det", "DET"), ("sea", 2, "obj", "NOUN")],
])
DEV = _conllu([
    [("The", 2, "det", "DET"), ("cat", 3, "nsubj", "NOUN"), ("ran", 0, "root", "VERB"), (".", 3, "punct", "PUNCT")],
    [("She", 2, "nsubj", "PRON"), ("read", 0, "root", "VERB"), ("a", 4, "det", "DET"), ("book", 2, "obj", "NOUN")],
])


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("e2e")
    (root / "text.txt").write_text(TEXT)
    (root / "train.conllu").write_text(TRAIN)
    (root / "dev.conllu").write_text(DEV)
    out = root / "out"
    argv = ["run", "--model", "debug:bert", "--text", str(root / "text.txt"), "--deps", str(root / "dev.conllu"),
            "--deps-train", str(root / "train.conllu"), "--coref", str(demo_inputs()["coref"]),
            "--out", str(out), "--quiet"]
    code = main(argv)
    assert code == 0
    return out


@pytest.mark.heavy
def test_every_promised_file(run_dir):
    assert (run_dir / "report.html").is_file() and (run_dir / "results.json").is_file()
    for ext in ("csv", "md", "tex"):
        assert list((run_dir / "tables").glob(f"*.{ext}")), ext
    pngs = {p.stem for p in (run_dir / "figures").glob("*.png")}
    svgs = {p.stem for p in (run_dir / "figures").glob("*.svg")}
    assert pngs and pngs == svgs
    for fam in ("general", "syntax", "coref"):
        assert (run_dir / "results" / f"{fam}.json").is_file(), fam
    assert list((run_dir / "views").glob("*.html"))
    assert not (run_dir / "maps").exists()  # the store only with --save-maps


def test_results_json_records_everything(run_dir):
    import hashlib

    from attnscope.models import load_model
    from attnscope.store.results import ResultsFolder

    res = json.loads((run_dir / "results.json").read_text())
    assert set(res["families"]) == {"general", "syntax", "coref"}
    assert {f: v["status"] for f, v in res["families"].items()} == dict.fromkeys(res["families"], "done")
    prov = res["provenance"]
    assert prov["model"]["name"] == "debug:bert"
    # run loads the model with its masked-LM head (for the gradients): the same seeded weights
    assert prov["model"]["weights_sha256"] == load_model("debug:bert", mlm_head=True).weights_hash
    root = run_dir.parent
    files = {"text": root / "text.txt", "deps": root / "dev.conllu", "deps-train": root / "train.conllu",
             "coref": demo_inputs()["coref"]}
    assert [d["role"] for d in prov["data"]] == list(files)
    for d in prov["data"]:  # each input's hash and size, worked out here from the file
        data = files[d["role"]].read_bytes()
        assert (d["sha256"], d["bytes"]) == (hashlib.sha256(data).hexdigest(), len(data)), d["role"]
    assert prov["command"].startswith("attnscope ")
    # results.json holds each family's results file as written, read back through the one reader
    found = ResultsFolder(run_dir)
    assert found.keys() == ["coref", "general", "syntax"] and found.problems == []
    assert {k: res["results"][k] for k in found.keys()} == {k: found.get(k) for k in found.keys()}


def test_report_has_each_section_and_links(run_dir):
    html = (run_dir / "report.html").read_text(encoding="utf-8")
    for anchor in ("summary", "sec-general", "sec-syntax", "sec-coref", "provenance"):
        assert f'id="{anchor}"' in html, anchor
    assert "paper (BERT-base)" in html  # paper numbers beside ours
    assert "Method notes" in html
    # a link to every head-view page, each opening on the head its name says (1-indexed L-H)
    from tests.viz.test_viz_pages import payload_of

    hrefs = re.findall(r'class="head-view" href="([^"]+)"', html)
    assert hrefs and sorted(set(hrefs)) == sorted(f"views/{p.name}" for p in (run_dir / "views").glob("*.html"))
    for href in hrefs:
        layer, head = (int(x) for x in re.fullmatch(r"views/.*-(\d+)-(\d+)\.html", href).groups())
        state = payload_of((run_dir / href).read_text(encoding="utf-8"))["state"]
        assert (state["layer"], state["heads"]) == (layer - 1, [head - 1]), href
    for fam in ("general", "syntax", "coref"):
        res = json.loads((run_dir / "results.json").read_text())["families"][fam]["section"]
        for fig in res["figures"]:
            assert f'id="figure-{fig["name"]}"' in html


def test_no_file_refers_to_a_network_address(run_dir):
    checked = 0
    for p in run_dir.rglob("*"):
        if p.is_file() and p.suffix in (".html", ".svg", ".json", ".csv", ".md", ".tex"):
            refs = network_references(p.read_text(encoding="utf-8"))
            assert refs == [], (p, refs[:3])
            checked += 1
    assert checked > 20
    text = re.sub(r"data:[a-z+/]+;base64,[A-Za-z0-9+/=]+", "", (run_dir / "report.html").read_text(encoding="utf-8"))
    assert not re.search(r"https?:|ftp:", text, re.I)


def test_resume_of_a_finished_run_reuses_every_family(run_dir, capsys):
    before = json.loads((run_dir / "results.json").read_text())
    argv = json.loads((run_dir / "run" / "state.json").read_text())["arguments"]
    cmd = ["run", "--model", argv["model"], "--text", argv["text"], "--deps", argv["deps"],
           "--deps-train", argv["deps_train"], "--coref", argv["coref"][0], "--out", str(run_dir),
           "--resume", "--quiet"]
    assert main(cmd) == 0
    assert capsys.readouterr().out.strip() == str(run_dir / "report.html")
    after = json.loads((run_dir / "results.json").read_text())
    assert {f: v["status"] for f, v in after["families"].items()} == dict.fromkeys(after["families"], "resumed")
    assert after["results"] == before["results"]


@pytest.mark.heavy
def test_bad_input_one_line_exit_2(tmp_path):
    bad = tmp_path / "bad.conllu"
    bad.write_text(DEV.replace("2\tread\tread\tVERB", "2\tread\tread\tVERB\textra"))
    proc = subprocess.run([sys.executable, "-m", "attnscope", "run", "--model", "debug:bert", "--deps", str(bad),
                           "--out", str(tmp_path / "out")], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {bad}:7:"), proc.stderr
    assert not (tmp_path / "out").exists()
