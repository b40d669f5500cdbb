"""Hints on common mistakes: a misspelt model name, a text file given to extract."""

from __future__ import annotations

import pytest
from conftest import one_line, says

from attnscope.cli.main import main
from attnscope.errors import ModelError
from attnscope.models.loading import _did_you_mean, load_model


@pytest.mark.parametrize("name,expect", [
    ("defualt", "default"), ("Default", "default"), ("debg", "debug"), ("debug:robert", "debug:roberta"),
])
def test_did_you_mean_close_names(name, expect):
    says(_did_you_mean(name), f"'{expect}'")


@pytest.mark.parametrize("name", ["bert-base-uncased", "org/model", "x"])
def test_no_suggestion_for_unrelated_names(name):
    assert _did_you_mean(name) == ""


def test_misspelt_model_suggests_default(monkeypatch):
    import attnscope.models.loading as loading

    monkeypatch.setattr(loading, "_hub_reachable", lambda timeout=3.0: False)
    for name in ("defualt", "./defualt"):
        with pytest.raises(ModelError) as e:
            load_model(name)
        says(one_line(e.value), name, "'default'")


def test_text_file_given_to_extract_points_to_prepare_unlabeled(tmp_path, capsys):
    p = tmp_path / "sents.txt"
    p.write_text("The cat sat.\nIt was happy.\n\nA new document.\n")
    code = main(["extract", str(p), "--model", "debug", "--out", str(tmp_path / "s"), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.splitlines()) == 1
    assert err.startswith(f"error: {p}:1: plain text") and "attnscope prepare unlabeled" in err
    assert not (tmp_path / "s").exists()


def test_broken_json_lines_still_reports_invalid_json(tmp_path, capsys):
    p = tmp_path / "in.jsonl"
    p.write_text('{"text": "a"}\nThe cat sat.\n')
    code = main(["extract", str(p), "--model", "debug", "--out", str(tmp_path / "s"), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and f"{p}:2: invalid JSON" in err


def test_paper_dependency_file_given_to_extract_points_to_prepare_depparse(tmp_path, capsys):
    p = tmp_path / "dev.txt"
    p.write_text("The 2-det\ncat 3-nsubj\nsat 0-root\n")
    code = main(["extract", str(p), "--model", "debug", "--out", str(tmp_path / "s"), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2
    says(err, f"error: {p}:1:", "dependency format")
    assert "attnscope prepare depparse" in err and len(err.splitlines()) == 1
