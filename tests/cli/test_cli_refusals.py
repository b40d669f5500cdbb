"""What a new user meets first: an output location that cannot be used, a value or an input that
gives nothing to do, an interrupted extraction. Every refusal is one line on stderr naming the
path or option, exit status 2, no traceback, nothing written, and comes before any model loads.
"""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
from conftest import one_line, says

from attnscope.cli.main import build_command
from attnscope.families import load_families
from tests.cli.test_cli import run

CONLLU = "1\tThe\t_\tDET\tDT\t_\t2\tdet\t_\t_\n2\tcat\t_\tNOUN\tNN\t_\t0\troot\t_\t_\n\n"


@pytest.fixture
def files(tmp_path):
    """Good inputs of every kind the commands below read."""
    d = tmp_path / "in"
    d.mkdir()
    (d / "ex.json").write_text(json.dumps([{"text": "the cat sat"}, {"text": "a dog ran"}]))
    (d / "one.conllu").write_text(CONLLU)
    (d / "text.txt").write_text("One sentence. Two.\nThree.\n\nFour.\n")
    (d / "deps").mkdir()
    (d / "deps" / "train.conllu").write_text(CONLLU)
    (d / "deps" / "dev.conllu").write_text(CONLLU)
    (d / "a-file").write_text("not a folder")
    return d


@pytest.fixture
def no_model(monkeypatch):
    """Fail the test if any command loads a model."""
    import attnscope.models.loading

    def load_model(*a, **k):
        raise AssertionError("a model was loaded before the output was checked")

    monkeypatch.setattr(attnscope.models.loading, "_load", load_model)


def _snapshot(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


# (arguments with OUT where the output goes, the option that names OUT, OUT is a folder?)
FOLDER_OUTPUTS = [
    (["run", "--model", "debug:bert", "--text", "{in}/ex.json", "--out", "OUT"], "--out"),
    (["demo", "--model", "debug:bert", "--out", "OUT"], "--out"),
    *[(["analyze", fam.key, "{in}/ex.json", "--model", "debug:bert", "--out", "OUT"], "--out")
      for fam in load_families()],
    (["compare", "{in}/ex.json", "{in}/ex.json", "--out", "OUT"], "--out"),
    (["compare", "--model-a", "debug:bert", "--model-b", "debug:gpt2", "--inputs", "{in}/ex.json",
      "--out", "OUT"], "--out"),
    (["extract", "{in}/ex.json", "--model", "debug", "--out", "OUT"], "--out"),
    (["import", "{in}/ex.json", "--allow-pickle", "--out", "OUT"], "--out"),
    (["prepare", "depparse", "{in}/deps", "--out", "OUT"], "--out"),
]
FILE_OUTPUTS = [
    (["prepare", "depparse", "{in}/one.conllu", "--out", "OUT"], "--out"),
    (["prepare", "unlabeled", "{in}/text.txt", "--model", "debug", "--out", "OUT"], "--out"),
    (["view", "{in}/ex.json", "--out", "OUT"], "--out"),
    (["view", "{in}/ex.json", "--out", "{tmp}/v.html", "--png", "OUT"], "--png"),
    (["view", "{in}/ex.json", "--out", "{tmp}/v.html", "--svg", "OUT"], "--svg"),
    (["export", "{in}/ex.json", "--out", "OUT"], "--out"),
]


def _id(args, option):
    words = [a for a in args[:2] if not a.startswith(("{", "-"))]
    return " ".join([*words, option])


CASES = [pytest.param(a, o, True, id=_id(a, o)) for a, o in FOLDER_OUTPUTS] + \
        [pytest.param(a, o, False, id=_id(a, o)) for a, o in FILE_OUTPUTS]


def _refused(capsys, tmp_path, files, args, out, expect):
    """Run ``args`` with OUT = ``out``; check the one-line refusal and that nothing changed."""
    args = [str(out) if a == "OUT" else a.format(**{"in": files, "tmp": tmp_path}) for a in args]
    before = _snapshot(tmp_path)
    code, stdout, err = run(capsys, *args)
    assert code == 2 and stdout == "", err
    assert err.splitlines() == [err.strip()] and "Traceback" not in err, err
    assert err.startswith(f"error: {out}: ") and expect in err, err
    assert _snapshot(tmp_path) == before  # no folder made, no probe left, nothing written
    return err


@pytest.mark.parametrize("args,option,folder", CASES)
def test_output_of_the_wrong_kind_is_refused(tmp_path, capsys, files, no_model, args, option, folder):
    """A regular file where a folder is written (`run --out FILE` ended in a NotADirectoryError
    traceback), or a folder where a file is written."""
    if folder:
        out = files / "a-file"
        expect = "is a file, not a " + ("store folder" if args[0] == "extract" else "folder")
    else:
        out = files / "deps"
        expect = "is a folder, not a file"
    err = _refused(capsys, tmp_path, files, args, out, expect)
    assert args[0] == "extract" or f"choose another {option}" in err


@pytest.mark.parametrize("args,option,folder", CASES)
def test_output_under_a_file_is_refused(tmp_path, capsys, files, no_model, args, option, folder):
    """An output whose folder cannot be made because a file stands in its way."""
    out = files / "a-file" / ("sub" if folder else "x.json")
    err = _refused(capsys, tmp_path, files, args, out, f"cannot be made, {files / 'a-file'} is a file")
    assert f"choose another {option}" in err


@pytest.fixture
def read_only(tmp_path):
    """A read-only mount (mode bits do not stop root; a read-only file system stops everyone)."""
    ro = tmp_path / "ro"
    ro.mkdir()
    if shutil.which("mount") is None:
        pytest.skip("needs mount(8)")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(ro)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a read-only tmpfs: {r.stderr.strip()}")
    yield ro
    subprocess.run(["umount", str(ro)], capture_output=True)


@pytest.mark.parametrize("args,option,folder", CASES)
def test_read_only_output_is_refused_before_any_work(tmp_path, capsys, files, no_model, read_only,
                                                      args, option, folder):
    """`prepare depparse` and `view` ended in an OSError traceback; `extract` and `run` said one
    line only after loading the model and computing, and advised --resume with nothing kept."""
    out = read_only / ("x" if folder else "x.json")
    err = _refused(capsys, tmp_path, files, args, out, "cannot be written (read-only file system")
    assert f"choose another {option}" in err and "--resume" not in err


def _commands_with(flag, command=None, path=()):
    """Every command (as its argument path) that declares ``flag``."""
    command = command or build_command()
    if any(flag in p.opts for p in command.params):
        yield list(path)
    for name, sub in getattr(command, "commands", {}).items():
        yield from _commands_with(flag, sub, (*path, name))


MAX_SEQ_LEN_COMMANDS = list(_commands_with("--max-seq-len"))
WRITING_COMMANDS = [" ".join(c) for c in _commands_with("--out")]


def test_every_command_with_max_seq_len_is_found():
    found = {" ".join(c) for c in MAX_SEQ_LEN_COMMANDS}
    assert {"extract", "run", "compare", "prepare unlabeled", "analyze general"} <= found


@pytest.mark.parametrize("command", MAX_SEQ_LEN_COMMANDS, ids=" ".join)
@pytest.mark.parametrize("value", ["0", "7"])
def test_max_seq_len_below_8_is_refused_by_every_command(tmp_path, capsys, no_model, command, value):
    """`extract --max-seq-len 0` wrote an empty store and exited 0, while `run` refused it: one
    rule for every command (8 is the least `run` accepted)."""
    out = ["--out", tmp_path / "o"] if " ".join(command) in WRITING_COMMANDS else []  # serve writes nothing
    code, stdout, err = run(capsys, *command, "--max-seq-len", value, *out)
    assert code == 2 and stdout == "" and err.splitlines() == [err.strip()], err
    assert "--max-seq-len" in err and ">= 8" in err.replace("greater than or equal to ", ">= ")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("args", [
    ["extract", "{in}/empty.conllu", "--model", "debug", "--out", "{tmp}/o"],
    ["prepare", "depparse", "{in}/empty.conllu", "--out", "{tmp}/o.json"],
    ["prepare", "depparse", "{in}/deps", "--out", "{tmp}/o"],  # dev is empty, train is not
], ids=["extract", "prepare-file", "prepare-folder"])
def test_empty_dependency_file_is_refused(tmp_path, capsys, files, no_model, args):
    """`extract empty.conllu` and `prepare depparse empty.conllu` exited 0 and wrote empty
    outputs; a split folder with one empty split wrote the other split."""
    (files / "empty.conllu").write_text("\n\n")
    (files / "deps" / "dev.conllu").write_text("")
    args = [a.format(**{"in": files, "tmp": tmp_path}) for a in args]
    code, stdout, err = run(capsys, *args)
    empty = files / "deps" / "dev.conllu" if "deps" in args[2] else files / "empty.conllu"
    assert code == 2 and stdout == "", err
    says(one_line(err.strip()), f"error: {empty}:", "no sentences")
    assert not list(tmp_path.glob("o*"))


@pytest.mark.parametrize("args,targets", [
    (["prepare", "depparse", "{in}/one.conllu", "--out", "{tmp}/o.json"], ["o.json"]),
    (["prepare", "depparse", "{in}/deps", "--out", "{tmp}/o"], ["o/dev.json"]),
    (["prepare", "unlabeled", "{in}/text.txt", "--model", "debug", "--out", "{tmp}/o.json"], ["o.json"]),
], ids=["depparse-file", "depparse-folder", "unlabeled"])
def test_prepare_refuses_an_existing_output_unless_overwrite(tmp_path, capsys, files, monkeypatch,
                                                             args, targets):
    """`prepare depparse --out EXISTING` replaced the file and exited 0, while every other
    command refused: one line, exit 2, nothing written, before any model loads; --overwrite
    replaces it."""
    args = [a.format(**{"in": files, "tmp": tmp_path}) for a in args]
    existing = tmp_path / targets[0]
    existing.parent.mkdir(parents=True, exist_ok=True)
    existing.write_text("keep me")
    before = _snapshot(tmp_path)
    with monkeypatch.context() as m:
        import attnscope.models.loading

        m.setattr(attnscope.models.loading, "_load", lambda *a, **k: pytest.fail("a model was loaded"))
        code, stdout, err = run(capsys, *args)
    assert code == 2 and stdout == "", err
    says(one_line(err.strip()), f"error: {existing}:", "already exists", "--overwrite")
    assert existing.read_text() == "keep me" and _snapshot(tmp_path) == before
    code, stdout, err = run(capsys, *args, "--overwrite")
    assert code == 0, err
    written = json.loads(existing.read_text())
    assert isinstance(written, list) and written and all(isinstance(e, dict) for e in written)


@pytest.mark.parametrize("command", [
    ["extract", "{one}", "--model", "debug", "--out", "{tmp}/o"],
    ["analyze", "general", "{one}", "--model", "debug:bert", "--out", "{tmp}/o"],
    ["run", "--model", "debug:bert", "--text", "{one}", "--out", "{tmp}/o"],
], ids=["extract", "analyze", "run"])
@pytest.mark.parametrize("text", [json.dumps({"text": "the cat sat"}),
                                  json.dumps({"text": "the cat sat"}, indent=2)], ids=["line", "indented"])
def test_a_json_file_holding_one_object_is_refused(tmp_path, capsys, command, text):
    """A .json file holding one object (not a list of them) was taken as one example, exit 0."""
    one = tmp_path / "one.json"
    one.write_text(text)
    args = [a.format(one=one, tmp=tmp_path) for a in command]
    code, stdout, err = run(capsys, *args)
    assert code == 2 and stdout == "", err
    assert err.splitlines() == [err.strip()], err
    says(err, f"error: {one}:", "JSON object", "[{...}, ...]", ".jsonl")
    assert not (tmp_path / "o").exists()


def test_a_one_line_json_lines_file_is_one_example(tmp_path):
    """The same object in a .jsonl file is JSON Lines: one example."""
    from attnscope.data.io import read_examples

    p = tmp_path / "one.jsonl"
    p.write_text(json.dumps({"text": "the cat sat"}) + "\n")
    assert [e.text for e in read_examples(p)] == ["the cat sat"]


def test_a_run_error_is_one_line_with_no_empty_line_before_it(tmp_path, capsys, files):
    """rich ended the (invisible) progress display of `run` with an empty line on a stderr that
    is not a terminal, so every error came after a blank line."""
    bad = files / "bad.txt"
    bad.write_text("x\n")
    code, stdout, err = run(capsys, "run", "--model", "debug:bert", "--deps", bad, "--out",
                            tmp_path / "o")
    assert code == 2 and stdout == ""
    assert err.startswith("error: ") and err.endswith("\n")
    says(one_line(err), f"{bad}:1:", "'word head-relation'", "1 columns")


def test_ctrl_c_during_extract_says_what_is_kept_and_resume_finishes(tmp_path, capsys, monkeypatch):
    """Ctrl-C exited 130 with no word. 12 examples, 3 per shard and per batch: interrupted
    while the third shard is written, 2 whole shards (6 examples) are kept, and --resume
    finishes a store equal to one extracted without interruption."""
    from attnscope.store import writer

    inp = tmp_path / "in.jsonl"
    inp.write_text("".join(json.dumps({"text": f"example {i} " + "word " * (i % 5)}) + "\n"
                           for i in range(12)))
    cmd = ["extract", inp, "--model", "debug", "--shard-size", "3", "--batch-size", "3", "-q"]
    assert run(capsys, *cmd, "--out", tmp_path / "ref")[0] == 0
    out = tmp_path / "s"
    write, calls = writer.ShardWriter.write, []

    def interrupted_write(self, sid):
        calls.append(sid)
        if len(calls) == 3:
            raise KeyboardInterrupt
        write(self, sid)

    monkeypatch.setattr(writer.ShardWriter, "write", interrupted_write)
    code, stdout, err = run(capsys, *cmd, "--out", out)
    assert code == 130 and stdout == ""
    # where the store is, what it keeps, and the flag that finishes it
    says(one_line(err.strip()), "interrupted:", str(out), "6 examples", "2 complete", "--resume")
    assert len(list((out / "shards").glob("*.safetensors"))) == 2
    monkeypatch.setattr(writer.ShardWriter, "write", write)
    assert run(capsys, *cmd, "--out", out, "--resume")[0] == 0
    shards = sorted((tmp_path / "ref" / "shards").glob("*.safetensors"))
    assert len(shards) == 4
    assert all((out / "shards" / f.name).read_bytes() == f.read_bytes() for f in shards)


def test_ctrl_c_before_the_store_is_begun_says_nothing_was_written(tmp_path, capsys, monkeypatch):
    import attnscope.models.loading

    def load_model(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(attnscope.models.loading, "_load", load_model)
    inp = tmp_path / "in.json"
    inp.write_text(json.dumps([{"text": "a b"}]))
    code, stdout, err = run(capsys, "extract", inp, "--out", tmp_path / "s", "-q")
    assert code == 130
    says(one_line(err.strip()), "interrupted:", "nothing", str(tmp_path / "s"))


def test_the_library_refuses_a_file_as_the_output_folder_naming_its_parameter(tmp_path, debug_bert):
    """``run_pipeline`` / ``run_family`` called from Python: one AttnscopeError naming
    ``out_dir`` (it was a NotADirectoryError traceback), before any model is loaded."""
    from attnscope.errors import AttnscopeError
    from attnscope.pipeline import RunConfig, demo_inputs, run_family, run_pipeline

    taken = tmp_path / "taken"
    taken.write_text("mine", encoding="utf-8")
    text = demo_inputs()["text"]
    with pytest.raises(AttnscopeError) as e:
        run_pipeline(RunConfig(model="debug:bert", text=text), taken)
    says(e.value, str(taken), "is a file", "out_dir")
    assert e.value.params == ("out_dir",)
    with pytest.raises(AttnscopeError) as e:
        run_family("general", {"text": text}, taken, model="no-such-model-is-loaded")
    says(e.value, str(taken), "is a file", "out_dir")
    assert taken.read_text(encoding="utf-8") == "mine"


def test_one_object_spread_over_lines_is_refused_whatever_the_name(tmp_path):
    """Indented, one object cannot be JSON Lines, whatever the file is called."""
    from attnscope.data.io import read_examples
    from attnscope.errors import InputError

    p = tmp_path / "one.jsonl"
    p.write_text(json.dumps({"text": "the cat sat"}, indent=2))
    with pytest.raises(InputError) as e:
        read_examples(p)
    says(e.value, str(p), "JSON object", ".jsonl")


def test_a_store_with_another_models_name_is_refused(tmp_path, capsys, files):
    """``analyze general STORE --model M``: the maps are the store's model's; a different M is
    refused in one line naming both models, nothing written; the store's own model is fine."""
    store = tmp_path / "store"
    code, _, err = run(capsys, "extract", files / "ex.json", "--model", "debug:bert", "--out", store, "-q")
    assert code == 0, err
    out = tmp_path / "out"
    code, _, err = run(capsys, "analyze", "general", store, "--model", "debug:gpt2", "--out", out, "-q")
    assert code == 2
    assert one_line(err.strip()) == (f"error: --model debug:gpt2: {store} holds the maps of debug:bert, not of "
                             "debug:gpt2; leave --model out to analyse those maps, or give debug:bert")
    assert not out.exists()
    code, _, err = run(capsys, "analyze", "general", store, "--model", "debug:bert", "--out", out, "-q")
    assert code == 0, err
