"""The command line: happy paths and one-line errors for bad input, with no partial output."""

import json
import subprocess
import sys

import pytest
from conftest import one_line, says

from attnscope.cli.main import main


def run(capsys, *args):
    code = main([str(a) for a in args])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture
def good(tmp_path):
    p = tmp_path / "in.json"
    p.write_text(json.dumps([{"words": ["the", "cat", "sat"]}, {"text": "a dog ran."}]))
    return p


def test_extract_info_export_import(tmp_path, good, capsys):
    code, out, err = run(capsys, "extract", good, "--model", "debug", "--out", tmp_path / "s", "--word-level")
    assert code == 0 and "2 examples written" in out and "written" not in err
    code, out, _ = run(capsys, "info", tmp_path / "s", "--json", "--verify")
    info = json.loads(out)
    assert code == 0 and info["examples"] == 2 and info["level"] == "word" and info["verify"] == "ok"
    code, _, err = run(capsys, "export", tmp_path / "s", "--format", "paper-pickle")
    pkl = tmp_path / "s_attn.pkl"
    assert code == 0 and pkl.exists()
    code, _, err = run(capsys, "import", pkl, "--out", tmp_path / "back")
    assert code == 2 and "--allow-pickle" in err and not (tmp_path / "back").exists()
    code, _, _ = run(capsys, "import", pkl, "--out", tmp_path / "back", "--allow-pickle")
    assert code == 0 and (tmp_path / "back" / "index.json").exists()


def test_prepare_commands(tmp_path, capsys, shared_data):
    code, _, err = run(capsys, "prepare", "depparse", shared_data / "ud-ewt" / "en_ewt-ud-dev.conllu",
                       "--out", tmp_path / "dev.json", "--limit", "5")
    data = json.loads((tmp_path / "dev.json").read_text())
    assert code == 0 and len(data) == 5 and {"words", "heads", "relns", "pos"} <= set(data[0])
    txt = tmp_path / "t.txt"
    txt.write_text("One. Two.\nThree.\n\nFour.\n")
    code, _, err = run(capsys, "prepare", "unlabeled", txt, "--model", "debug", "--out", tmp_path / "u.json")
    assert code == 0 and len(json.loads((tmp_path / "u.json").read_text())) == 2


@pytest.mark.parametrize("content, expect", [
    ("[{\"text\": \"a\"},\n {\"text\": ]", "in.json:2: invalid JSON"),
    ("[{\"text\": \"a\", \"tokens\": [\"a\"]}]", "in.json: example 0: needs exactly one of text/words/tokens"),
    ("[{\"tokens\": [\"[CLS]\", \"zebra\", \"[SEP]\"]}]", "in.json: example 0: token 'zebra' is not in the vocabulary"),
])
def test_bad_inputs_leave_no_store(tmp_path, capsys, content, expect):
    p = tmp_path / "in.json"
    p.write_text(content)
    code, _, err = run(capsys, "extract", p, "--model", "debug", "--out", tmp_path / "s")
    assert code == 2
    line = err.strip().splitlines()[-1]
    assert line.startswith("error: ") and expect in line
    assert not (tmp_path / "s").exists()


def test_model_errors(tmp_path, good, capsys):
    code, _, err = run(capsys, "extract", good, "--model", "nobody/no-such-model-xyz", "--out", tmp_path / "s")
    assert code == 2
    says(err, "nobody/no-such-model-xyz", "not found")
    (tmp_path / "notmodel").mkdir()
    code, _, err = run(capsys, "extract", good, "--model", tmp_path / "notmodel", "--out", tmp_path / "s")
    assert code == 2
    says(err, str(tmp_path / "notmodel"), "model folder")
    code, _, err = run(capsys, "extract", good, "--model", "debug", "--max-seq-len", "100000", "--out", tmp_path / "s")
    assert code == 2 and "position limit" in err
    assert not (tmp_path / "s").exists()


def test_existing_output_and_corrupt_store(tmp_path, good, capsys):
    assert run(capsys, "extract", good, "--model", "debug", "--out", tmp_path / "s")[0] == 0
    code, _, err = run(capsys, "extract", good, "--model", "debug", "--out", tmp_path / "s")
    assert code == 2
    says(err, str(tmp_path / "s"), "already", "store")
    shard = next((tmp_path / "s" / "shards").glob("*.safetensors"))
    shard.write_bytes(shard.read_bytes()[:100])
    code, _, err = run(capsys, "info", tmp_path / "s", "--verify")
    assert code == 2 and shard.name in err


def test_unknown_debug_family_and_unreadable_file(tmp_path, good, capsys):
    code, _, err = run(capsys, "extract", good, "--model", "debug:no_such_type", "--out", tmp_path / "s")
    assert code == 2
    says(err, "no_such_type", "debug")
    code, _, err = run(capsys, "extract", tmp_path / "missing.json", "--model", "debug", "--out", tmp_path / "s")
    assert code == 2
    says(err, str(tmp_path / "missing.json"), "no such file")


def test_real_process_prints_one_line_and_no_traceback(tmp_path):
    p = tmp_path / "in.jsonl"
    p.write_text('{"text": "ok"}\n{"words": []}\n')
    r = subprocess.run([sys.executable, "-m", "attnscope", "extract", str(p), "--model", "debug", "--out",
                        str(tmp_path / "s"), "--quiet"], capture_output=True, text=True)
    assert r.returncode == 2
    says(one_line(r.stderr.strip()), "error: ", f"{p}:2:", "example 1", "'words'", "empty")
    assert "Traceback" not in r.stderr


def test_info_checks_shard_sizes_always_and_checksums_with_verify(tmp_path, capsys):
    """`info` said `status: complete` and exited 0 on a store with a cut shard. Now every shard's
    size is checked against its own header (cheap, always) and --verify checks the sha256 the
    index holds; a bad shard is one line naming it, and nothing is printed on stdout."""
    p = tmp_path / "in.json"
    p.write_text(json.dumps([{"text": f"the cat number {i} sat"} for i in range(6)]))
    assert run(capsys, "extract", p, "--model", "debug", "--out", tmp_path / "s", "--shard-size", "2",
               "-q")[0] == 0
    shards = sorted((tmp_path / "s" / "shards").glob("*.safetensors"))
    assert len(shards) == 3
    good = {f: f.read_bytes() for f in shards}

    shards[1].write_bytes(good[shards[1]][:-10])  # cut short
    for flags in ([], ["--verify"], ["--json"]):
        code, out, err = run(capsys, "info", tmp_path / "s", *flags)
        assert code == 2 and out == "" and err.splitlines() == [err.strip()]
        says(err, f"error: {shards[1]}:", "truncated")

    shards[1].write_bytes(good[shards[1]])
    flipped = bytearray(good[shards[2]])
    flipped[-3] ^= 0xFF  # same size, one byte of the last array changed: only a checksum sees it
    shards[2].write_bytes(bytes(flipped))
    code, out, err = run(capsys, "info", tmp_path / "s", "--json")
    assert code == 0 and json.loads(out)["status"] == "complete"
    code, out, err = run(capsys, "info", tmp_path / "s", "--verify")
    assert code == 2 and out == ""
    says(one_line(err), f"error: {shards[2]}:", "checksum")

    shards[2].unlink()
    code, out, err = run(capsys, "info", tmp_path / "s")
    assert code == 2 and out == "" and err == f"error: {shards[2]}: shard missing\n"


def test_a_stop_is_raised_at_once_and_again_at_the_next_unit_if_a_library_swallowed_it(debug_bert):
    """Inside a command, SIGINT and SIGTERM raise KeyboardInterrupt and note the stop; a pass
    that goes on (the first interrupt lost in a library) stops at its next finished batch, before
    analysing more; the note and the handlers end with the command."""
    import os
    import signal

    from attnscope.analyses.relative_position import RelativePosition
    from attnscope.cli.main import signals_stop
    from attnscope.data.records import Example
    from attnscope.executor import run_pass
    from attnscope.progress import check_stop

    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    for how in (signal.SIGINT, signal.SIGTERM):
        with signals_stop():
            with pytest.raises(KeyboardInterrupt):
                os.kill(os.getpid(), how)
                for _ in range(10 ** 6):  # the handler runs between two bytecodes
                    pass
            # the interrupt was caught here, as a swallowing library would: the pass stops anyway
            seen = []
            with pytest.raises(KeyboardInterrupt):
                run_pass([Example(text="the cat sat.")] * 4, [RelativePosition()], model=debug_bert,
                         progress=lambda *a, seen=seen: seen.append(a))
            assert seen == []  # stopped at the first finished batch, before reporting it
        check_stop()  # the command is over: nothing is asked any more
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before
