"""The store: round trip, random access, streaming, resume after kill -9, corruption, pickles."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import float16_row_bound, one_line, says, softmax_bound

from attnscope.errors import InputError, StoreError
from attnscope.extract import ExtractOptions, extract
from attnscope.jobs import extract_to_store
from attnscope.store import open_store
from attnscope.store.paper_pickle import export_paper_pickle, import_paper_pickle, read_paper_pickle

WORDS = "the cat sat on the old mat because it was big and red".split()


def examples(n, seed=0):
    rng = np.random.default_rng(seed)
    return [{"words": list(rng.choice(WORDS, size=int(rng.integers(2, 12)))), "id": i} for i in range(n)]


def test_round_trip_random_access_and_streaming(tmp_path, debug_bert):
    exs = examples(40)
    from attnscope.data.io import example_from_dict

    records = [example_from_dict(e, i) for i, e in enumerate(exs)]
    stats = extract_to_store(records, tmp_path / "s", debug_bert, shard_size=7, dtype="float32",
                             options=ExtractOptions(word_level=True, batch_size=5))
    assert stats.examples_out == 40
    store = open_store(tmp_path / "s")
    assert len(store) == 40 and store.complete and store.level == "word"
    assert len(store.shards()) == 6  # ceil(40 / 7)
    direct = {m.index: m for b in extract(records, debug_bert, word_level=True) for m in b}
    for i in (0, 13, 39):
        m = store[i]
        assert m.index == i and m.example.fields == {"id": i}
        n = len(debug_bert.tokenizer(" ".join(records[i].words))["input_ids"])  # token keys of the word rows
        np.testing.assert_allclose(m.attn, direct[i].attn, atol=softmax_bound(n), rtol=0)  # float32, other batches
        assert m.tokens == direct[i].tokens
    streamed = sorted(m.index for m in store)
    assert streamed == list(range(40))
    assert store.by_index(5).index == 5
    assert store.verify() == []
    manifest = json.loads((tmp_path / "s" / "manifest.json").read_text())
    assert manifest["model"]["weights_sha256"] == debug_bert.weights_hash
    assert manifest["arguments"]["options"]["word_level"] is True and manifest["seed"] == 0
    assert {"torch", "transformers", "attnscope"} <= set(manifest["versions"])


def test_float16_is_the_default_and_is_close(tmp_path, debug_bert):
    from attnscope.data.io import example_from_dict

    records = [example_from_dict(e, i) for i, e in enumerate(examples(5))]
    extract_to_store(records, tmp_path / "s", debug_bert)
    store = open_store(tmp_path / "s")
    assert store.manifest["dtype"] == "float16"
    n = store[0].attn.shape[-1]
    np.testing.assert_allclose(store[0].attn.sum(-1), 1.0, atol=float16_row_bound(n), rtol=0)  # float16 weights


def test_existing_store_is_refused_unless_resume_or_overwrite(tmp_path, debug_bert):
    from attnscope.data.io import example_from_dict

    records = [example_from_dict(e, i) for i, e in enumerate(examples(5))]
    extract_to_store(records, tmp_path / "s", debug_bert)
    with pytest.raises(StoreError) as e:
        extract_to_store(records, tmp_path / "s", debug_bert)
    says(one_line(e.value), str(tmp_path / "s"), "already", "store")
    with pytest.raises(StoreError, match="cannot resume"):
        extract_to_store(records[:3], tmp_path / "s", debug_bert, resume=True)
    extract_to_store(records[:3], tmp_path / "s", debug_bert, overwrite=True)
    assert len(open_store(tmp_path / "s")) == 3
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(StoreError, match="not a store"):
        extract_to_store(records, tmp_path / "other", debug_bert, overwrite=True)
    assert (tmp_path / "other" / "notes.txt").exists()


def test_corrupt_and_truncated_shards_are_named(tmp_path, debug_bert):
    from attnscope.data.io import example_from_dict

    records = [example_from_dict(e, i) for i, e in enumerate(examples(10))]
    extract_to_store(records, tmp_path / "s", debug_bert, shard_size=4)
    shard = tmp_path / "s" / "shards" / "00001.safetensors"
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2])
    store = open_store(tmp_path / "s")
    with pytest.raises(StoreError) as e:
        list(store)
    says(one_line(e.value), "00001.safetensors:", "truncated")
    assert any("checksum mismatch" in p for p in store.verify())
    shard.write_bytes(b"\x00" * 3)
    with pytest.raises(StoreError, match="00001.safetensors"):
        store[5]


def test_not_a_store(tmp_path):
    with pytest.raises(StoreError) as e:
        open_store(tmp_path / "missing")
    says(one_line(e.value), str(tmp_path / "missing"), "no such")
    (tmp_path / "x").mkdir()
    with pytest.raises(StoreError, match="not an attnscope store"):
        open_store(tmp_path / "x")
    (tmp_path / "x" / "manifest.json").write_text("{not json")
    with pytest.raises(StoreError, match="corrupt manifest"):
        open_store(tmp_path / "x")


def test_paper_pickle_round_trip_and_refusal(tmp_path, debug_bert):
    from attnscope.data.io import example_from_dict

    records = [example_from_dict(e, i) for i, e in enumerate(examples(6))]
    extract_to_store(records, tmp_path / "s", debug_bert)
    store = open_store(tmp_path / "s")
    pkl = tmp_path / "dev_attn.pkl"
    assert export_paper_pickle(store, pkl) == 6
    with pytest.raises(InputError, match="pass allow_pickle if you trust") as refused:
        read_paper_pickle(pkl)
    assert refused.value.params == ("allow_pickle",)  # the command line shows --allow-pickle
    data = read_paper_pickle(pkl, allow_pickle=True)
    assert data[2]["tokens"] == store[2].tokens and data[2]["attns"].dtype == np.float16
    assert data[2]["words"] == records[2].words and data[2]["id"] == 2
    import_paper_pickle(pkl, tmp_path / "back", allow_pickle=True)
    back = open_store(tmp_path / "back")
    np.testing.assert_allclose(back[2].attn, store[2].attn, atol=1e-3)


def test_pickle_with_foreign_classes_is_rejected_even_when_allowed(tmp_path):
    import pickle

    class Evil:
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    p = tmp_path / "evil.pkl"
    p.write_bytes(pickle.dumps([{"tokens": ["a"], "attns": Evil()}]))
    with pytest.raises(InputError, match="refusing to load"):
        read_paper_pickle(p, allow_pickle=True)


def _shard_contents(root: Path) -> dict:
    from safetensors.numpy import load_file

    out = {}
    for f in sorted((root / "shards").glob("*.safetensors")):
        arrays = load_file(str(f))
        from safetensors import safe_open

        with safe_open(str(f), framework="np") as sf:
            records = sf.metadata()["records"]
        out[f.name] = (records, {k: v.tobytes() for k, v in arrays.items()})
    return out


@pytest.mark.heavy
def test_kill_9_then_resume_gives_the_same_store(tmp_path):
    inp = tmp_path / "in.json"
    inp.write_text(json.dumps(examples(250, seed=1)))
    cmd = [sys.executable, "-m", "attnscope", "extract", str(inp), "--model", "debug:bert", "--batch-size",
           "1", "--shard-size", "10", "--quiet"]
    env = dict(os.environ, OMP_NUM_THREADS="1")  # tiny model: threads only spin on a busy machine
    subprocess.run(cmd + ["--out", str(tmp_path / "full")], check=True, capture_output=True, env=env)
    proc = subprocess.Popen(cmd + ["--out", str(tmp_path / "killed")], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env=env)
    shards = tmp_path / "killed" / "shards"
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if shards.is_dir() and len(list(shards.glob("*.safetensors"))) >= 3:
            break
        time.sleep(0.005)
    assert proc.poll() is None, "extraction finished before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    partial = open_store(tmp_path / "killed")  # still readable
    assert not partial.complete and 0 < len(partial) < 250
    assert all(m.attn.shape[-1] == len(m.tokens) for m in partial)
    subprocess.run(cmd + ["--out", str(tmp_path / "killed"), "--resume"], check=True, capture_output=True,
                   env=env)
    assert open_store(tmp_path / "killed").complete
    assert not list(shards.glob(".*.tmp"))  # the shard that was in flight is cleaned away
    assert _shard_contents(tmp_path / "killed") == _shard_contents(tmp_path / "full")
    full_index = json.loads((tmp_path / "full" / "index.json").read_text())
    resumed_index = json.loads((tmp_path / "killed" / "index.json").read_text())
    assert full_index == resumed_index
