"""``attnscope demo`` on the packaged model (slow: the real model on the packaged sample)."""

from __future__ import annotations

import json

import pytest

from attnscope.cli.main import main


@pytest.mark.slow
def test_demo_runs_every_family_and_prints_the_report(tmp_path, capsys):
    out = tmp_path / "demo"
    assert main(["demo", "--out", str(out), "--quiet"]) == 0
    printed = capsys.readouterr().out.strip()
    assert printed == str(out / "report.html")
    res = json.loads((out / "results.json").read_text())
    assert {k: v["status"] for k, v in res["families"].items()} == {
        "general": "done", "syntax": "done", "coref": "done"}
    prov = res["provenance"]
    assert prov["model"]["name"] == "default" and (prov["model"]["num_layers"], prov["model"]["num_heads"]) == (6, 12)
    assert prov["counts"] == {"text examples": prov["counts"]["text examples"], "dependency sentences (scored)": 12,
                              "dependency sentences (train)": 28, "coreference sentences": 14}
    html = (out / "report.html").read_text(encoding="utf-8")
    assert "What does sentence-transformers/all-MiniLM-L6-v2 look at?" in html  # the model behind "default"
    # A second demo in the same folder replaces the first; --resume reuses it.
    assert main(["demo", "--out", str(out), "--quiet", "--resume"]) == 0
    again = json.loads((out / "results.json").read_text())
    assert {v["status"] for v in again["families"].values()} == {"resumed"}
    assert again["results"] == res["results"]


def test_demo_refuses_a_folder_that_is_not_a_run(tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    assert main(["demo", "--out", str(out), "--quiet"]) == 2
    assert "other files" in capsys.readouterr().err
    assert (out / "notes.txt").read_text() == "keep me"
