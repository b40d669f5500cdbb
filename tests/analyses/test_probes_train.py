"""Probing classifiers (Table 3): features, baselines worked out by hand, a planted head."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from conftest import make_map  # noqa: E402

from attnscope.analyses.probes.features import (  # noqa: E402
    SentenceSource,
    collate,
    probe_sentence,
    punctuation_mask,
    sentences_from_maps,
)
from attnscope.analyses.probes.models import (  # noqa: E402
    AttentionGloveProbe,
    AttentionProbe,
    DistanceGloveMLP,
    distance_features,
    right_branching,
)
from attnscope.analyses.probes.training import (  # noqa: E402
    TrainConfig,
    evaluate,
    right_branching_uas,
    train_probes,
)
from attnscope.data.records import Example  # noqa: E402
from attnscope.maps import AttentionBatch  # noqa: E402


def random_tree(rng, n):
    order = rng.permutation(n)
    heads = [0] * n
    for k in range(1, n):
        heads[order[k]] = int(order[rng.integers(0, k)]) + 1
    return heads


def planted_maps(count, seed, L=2, H=2, planted=(1, 0)):
    """Random attention except head ``planted``, where each word puts most weight on its gold
    head ([CLS] for the root word)."""
    rng = np.random.default_rng(seed)
    maps = []
    for index in range(count):
        n = int(rng.integers(3, 9))
        heads = random_tree(rng, n)
        toks = ["[CLS]"] + [f"w{i}" for i in range(n)] + ["[SEP]"]
        a = rng.random((L, H, n + 2, n + 2))
        spike = np.zeros((n + 2, n + 2))
        for w, h in enumerate(heads, start=1):
            spike[w, h] = 3.0  # h = 0 is [CLS] = ROOT
        a[planted] = a[planted] * 0.3 + spike
        a = a / a.sum(-1, keepdims=True)
        ex = Example(words=toks[1:-1], heads=heads, relns=["dep"] * n)
        maps.append(make_map(a, toks, example=ex, index=index))
    return maps


def source_of(maps, glove=None, chunk=16, cache_bytes=1 << 30):
    def batches():
        for i in range(0, len(maps), chunk):
            yield AttentionBatch(maps[i:i + chunk])

    return SentenceSource(batches, glove, cache_bytes=cache_bytes)


def test_root_features_sum_to_and_mean_from_specials():
    toks = ["[CLS]", "a", "b", "[SEP]"]
    a = np.array([[0.1, 0.2, 0.3, 0.4],
                  [0.5, 0.1, 0.2, 0.2],
                  [0.3, 0.3, 0.3, 0.1],
                  [0.0, 0.6, 0.4, 0.0]])
    m = make_map(a, toks, example=Example(words=["a", "b"], heads=[2, 0], relns=["x", "root"]))
    s = probe_sentence(m)
    f = s.attn[0].astype(np.float32)
    # words -> ROOT: a: 0.5 + 0.2 = 0.7, b: 0.3 + 0.1 = 0.4; ROOT -> words: mean of rows 0 and 3
    np.testing.assert_allclose(f[1:, 0], [0.7, 0.4], atol=1e-3)
    np.testing.assert_allclose(f[0, 1:], [(0.2 + 0.6) / 2, (0.3 + 0.4) / 2], atol=1e-3)
    np.testing.assert_allclose(f[1:, 1:], a[1:3, 1:3], atol=1e-3)
    first = probe_sentence(m, root="first").attn[0].astype(np.float32)
    np.testing.assert_allclose(first[1:, 0], [0.5, 0.3], atol=1e-3)
    assert s.heads.tolist() == [2, 0]


def test_punctuation_is_the_punct_relation():
    # the paper's PTB conversion: `` and -LRB- are punct (character test: not punctuation),
    # # and $ are not (character test: punctuation); the relation decides
    words = ["``", "-LRB-", "#", "$", "5", "''"]
    ex = Example(words=words, relns=["punct", "punct", "dep", "dep", "num", "punct"],
                 pos=["``", "-LRB-", "#", "$", "CD", "''"])
    assert punctuation_mask(ex).tolist() == [True, True, False, False, False, True]
    assert punctuation_mask(Example(words=["a", "."], relns=["root", "punct:x"])).tolist() == [False, True]


def test_punctuation_from_upos_pos_or_characters():
    assert punctuation_mask(Example(words=["a", "."], upos=["NOUN", "PUNCT"])).tolist() == [False, True]
    assert punctuation_mask(Example(words=["a", "."], pos=["NN", "."])).tolist() == [False, True]
    assert punctuation_mask(Example(words=["a", "--", "b"])).tolist() == [False, True, False]


def test_right_branching_worked_by_hand():
    # sentence 1: heads [2, 3, 0] = right-branching exactly: 3/3
    # sentence 2: heads [0, 1, 1, 1] with a final "." (PUNCT, not scored): rb = [2, 3, 4, 0]
    #   scored words 1..3: 0 != 2, 1 != 3, 1 != 4 -> 0/3
    maps = []
    for i, (words, heads, upos) in enumerate([
            (["a", "b", "c"], [2, 3, 0], ["X", "X", "X"]),
            (["d", "e", "f", "."], [0, 1, 1, 1], ["X", "X", "X", "PUNCT"])]):
        toks = ["[CLS]"] + words + ["[SEP]"]
        n = len(toks)
        relns = ["punct" if u == "PUNCT" else "dep" for u in upos]
        ex = Example(words=words, heads=heads, relns=relns, upos=upos)
        maps.append(make_map(np.full((n, n), 1 / n), toks, example=ex, index=i))
    run = right_branching_uas(source_of(maps))
    assert (run.correct, run.total) == (3, 6)
    assert right_branching(1).tolist() == [0]


def test_distance_features_by_hand():
    f = distance_features(4)  # [dependent j, candidate i, F]
    assert f.shape == (4, 4, 13)
    assert f[1, 2, 0] == 1 and f[1, 2, :10].sum() == 1  # i - j = +1: first "ahead" indicator
    assert f[3, 1, 6] == 1  # i - j = -2: second "behind" indicator
    assert f[1, 3, 10] == pytest.approx(0.2) and f[1, 3, 11] == 0  # continuous ahead distance
    assert f[2, 0, 12] == 1 and f[2, 0, :12].sum() == 0  # ROOT


def test_planted_head_gives_the_attention_probe_full_uas():
    train = source_of(planted_maps(120, seed=1))
    dev = source_of(planted_maps(40, seed=2))
    torch.manual_seed(0)
    probe = AttentionProbe(4)
    before = evaluate(probe, dev)
    runs = train_probes({"attn": probe}, train, dev, TrainConfig(epochs=15, patience=3, lr=0.1, attn_lr=None,
                                                                          seed=0))
    c, t = evaluate(probe, dev)
    assert before[0] < t  # an untrained probe is not already perfect
    assert c == t and runs["attn"].uas == 1.0
    # the planted head (layer 1, head 0 -> k = 2) dominates the dependent -> candidate weights
    assert int(torch.argmax(probe.u.detach())) == 2


def test_glove_probe_and_mlp_train_and_are_seeded():
    vectors = np.random.default_rng(0).normal(size=(11, 5)).astype(np.float32)
    maps = planted_maps(40, seed=3)

    class G:  # a tiny GloVe-like table: word "wi" -> row i
        def lookup(self, words):
            return np.array([int(w[1:]) for w in words])

    def once():
        train, dev = source_of(maps, G()), source_of(planted_maps(10, seed=4), G())
        torch.manual_seed(0)
        mods = {"attn+glove": AttentionGloveProbe(4, vectors), "distance+glove": DistanceGloveMLP(vectors, 16)}
        return train_probes(mods, train, dev, TrainConfig(epochs=3, patience=5, lr=0.05, seed=0))

    a, b = once(), once()
    for n in a:
        # seeded: two runs give the very same losses and dev scores
        assert [(h["loss"], h["dev_uas"]) for h in a[n].history] == \
            [(h["loss"], h["dev_uas"]) for h in b[n].history]
        assert a[n].total > 0 and a[n].epochs_run == 3
    # the planted head is there to be found: far above chance (about 1 / 5 candidates)
    assert a["attn+glove"].uas > 0.6


def test_stream_without_cache_gives_the_same_batches():
    maps = planted_maps(30, seed=5)
    cached, streamed = source_of(maps), source_of(maps, cache_bytes=0)
    for _ in range(2):  # second pass: from the cache / read again
        a = [[s.index for s in b] for b in cached.shuffled_batches(4, np.random.default_rng(0), 2)]
        b = [[s.index for s in b] for b in streamed.shuffled_batches(4, np.random.default_rng(0), 2)]
        assert a == b
    # nothing fits in 0 bytes: the features went to a temporary file, read back by memory map
    assert cached._spill is None and streamed._spill is not None
    assert cached.store_passes == streamed.store_passes == 1  # the store is read once
    assert all(isinstance(s.attn, np.memmap) for s in streamed.sentences())
    for x, y in zip(cached.sentences(), streamed.sentences()):
        np.testing.assert_array_equal(x.attn, y.attn)
    assert sorted(i for b in a for i in b) == list(range(30))


def test_collate_masks_self_and_padding():
    sents = sentences_from_maps(planted_maps(2, seed=6))
    b = collate(sents)
    M = max(s.num_words for s in sents) + 1
    assert b.candidates.shape == (2, M, M)
    for k, s in enumerate(sents):
        m = s.num_words + 1
        assert not b.candidates[k].diagonal().any()
        assert b.candidates[k, 1, :m].sum() == m - 1 and not b.candidates[k, :, m:].any()
        assert b.heads[k, 0] == -1


def test_the_attention_only_probe_has_its_own_learning_rate():
    from attnscope.analyses.probes.training import _lr

    vectors = np.zeros((3, 2), np.float32)
    cfg = TrainConfig(lr=0.01)
    assert _lr(AttentionProbe(2), cfg) == 0.05 and _lr(AttentionGloveProbe(2, vectors), cfg) == 0.01
    assert _lr(DistanceGloveMLP(vectors, 4), cfg) == 0.01
    assert _lr(AttentionProbe(2), TrainConfig(lr=0.02, attn_lr=None)) == 0.02


def test_training_bookkeeping_and_early_stopping():
    # the planted head is learnt to dev UAS 1.0, which cannot improve: training must stop
    # exactly `patience` epochs after the best one, with the best epoch's weights kept.
    train = source_of(planted_maps(120, seed=1))
    dev = source_of(planted_maps(40, seed=2))
    torch.manual_seed(0)
    probe = AttentionProbe(4)
    run = train_probes({"attn": probe}, train, dev, TrainConfig(epochs=15, patience=2, lr=0.1,
                                                               attn_lr=None, seed=0))["attn"]
    assert run.name == "attn" and run.parameters == 8  # w and u, one weight per head each
    assert run.uas == 1.0 and run.epochs_run == run.best_epoch + 2 < 15
    assert [h["epoch"] for h in run.history] == list(range(1, run.epochs_run + 1))
    assert [h["dev_uas"] for h in run.history][run.best_epoch - 1] == 1.0
    assert all(h["dev_uas"] < 1.0 for h in run.history[:run.best_epoch - 1])
    assert set(run.history[0]) == {"epoch", "loss", "dev_uas", "seconds"}
    assert all(h["seconds"] > 0 for h in run.history)
    assert run.seconds_per_epoch == pytest.approx(np.mean([h["seconds"] for h in run.history]))
    # the loss is a mean per dependent: positive, and lower once the head is learnt
    assert 0 < run.history[-1]["loss"] < run.history[0]["loss"]
    assert evaluate(probe, dev) == (run.correct, run.total)


def test_one_adam_step_moves_each_weight_by_the_probes_learning_rate():
    # Adam's first step moves every weight with a non-zero gradient by lr * g / (|g| + eps),
    # i.e. by lr: one batch holding every training sentence, one epoch.
    train = source_of(planted_maps(20, seed=1))
    dev = source_of(planted_maps(10, seed=2))
    for cfg, want in ((TrainConfig(epochs=1, batch_size=64, lr=0.01, attn_lr=0.05), 0.05),
                      (TrainConfig(epochs=1, batch_size=64, lr=0.02, attn_lr=None), 0.02)):
        probe = AttentionProbe(4)  # starts at zero
        train_probes({"attn": probe}, train, dev, cfg)
        moved = torch.cat([probe.w.detach(), probe.u.detach()]).abs()
        np.testing.assert_allclose(moved.numpy(), want, rtol=1e-4)


def test_a_dev_set_without_scored_dependents_and_zero_epochs():
    # every dev word is punctuation: nothing is scored, the dev UAS is NaN and never improves,
    # so training stops after `patience` epochs
    dev_maps = planted_maps(5, seed=2)
    for m in dev_maps:
        m.example.relns = ["punct"] * len(m.example.relns)
    train = source_of(planted_maps(20, seed=1))
    run = train_probes({"attn": AttentionProbe(4)}, train, source_of(dev_maps),
                       TrainConfig(epochs=5, patience=2))["attn"]
    assert run.epochs_run == 2 and all(np.isnan(h["dev_uas"]) for h in run.history)
    # no epoch at all: no history, no seconds per epoch
    run = train_probes({"attn": AttentionProbe(4)}, train, source_of(dev_maps),
                       TrainConfig(epochs=0))["attn"]
    assert run.history == [] and run.epochs_run == 0 and np.isnan(run.seconds_per_epoch)


def test_training_killed_after_an_epoch_goes_on_from_its_state_with_the_same_numbers(tmp_path):
    """The epoch state (``state=``): a run stopped inside epoch 3 goes on at epoch 3 from what
    epoch 2 kept, and ends with the uninterrupted run's histories, scores and weights; a state of
    another job is not read."""
    from attnscope.store.checkpoints import StateFile

    vectors = np.random.default_rng(0).normal(size=(11, 5)).astype(np.float32)

    class G:
        def lookup(self, words):
            return np.array([int(w[1:]) for w in words])

    def train(state=None, stop_at=None):
        torch.manual_seed(0)
        mods = {"attn": AttentionProbe(4), "attn+glove": AttentionGloveProbe(4, vectors)}
        epochs = []

        def progress(step, done, total):
            epochs.append(step)
            if step == stop_at:
                raise KeyboardInterrupt
        runs = train_probes(mods, source_of(planted_maps(40, seed=3), G()), source_of(planted_maps(10, seed=4), G()),
                            TrainConfig(epochs=4, patience=5, lr=0.05, seed=0), progress, state=state)
        return runs, mods, sorted(set(epochs))

    whole, whole_mods, _ = train()
    path = tmp_path / "probes.safetensors"
    with pytest.raises(KeyboardInterrupt):
        train(StateFile(path, "job"), stop_at="probes epoch 3")
    record, arrays = StateFile(path, "job").load()
    assert record["epoch"] == 2 and set(record["runs"]) == {"attn", "attn+glove"}
    assert {k.split("/", 2)[2] for k in arrays if k.startswith("now/attn+glove/")} == {
        "vectors.root", "cand.weight", "cand.bias", "dep.weight"}  # the trained tensors, not the table
    again, again_mods, steps = train(StateFile(path, "job"))
    assert steps == ["probes epoch 3", "probes epoch 4"]  # epochs 1-2 not redone
    for n in whole:
        strip = lambda r: [{k: v for k, v in h.items() if k != "seconds"} for h in r.history]  # noqa: E731
        assert strip(again[n]) == strip(whole[n]) and len(whole[n].history) == 4
        assert (again[n].uas, again[n].correct, again[n].best_epoch) == (whole[n].uas, whole[n].correct,
                                                                         whole[n].best_epoch)
        for k, v in whole_mods[n].state_dict().items():
            torch.testing.assert_close(again_mods[n].state_dict()[k], v, rtol=0, atol=0)
    _, _, steps = train(StateFile(path, "another job"))
    assert steps[0] == "probes epoch 1"


def test_a_run_resumed_after_its_last_epoch_reports_the_sentences_it_was_trained_on(tmp_path):
    """A run killed after its last epoch was kept redoes no epoch, so it never reads the train
    set: the sentences counted (and skipped) come from the state, as the killed run counted them
    (they are in results.json: a resumed run's results equal the uninterrupted run's)."""
    from attnscope.store.checkpoints import StateFile

    state = StateFile(tmp_path / "probes.safetensors", "job")
    maps = planted_maps(40, seed=3)
    maps[5].example.heads = None  # no gold tree: skipped
    config = TrainConfig(epochs=2, patience=5, lr=0.05, seed=0)
    first = source_of(maps)
    train_probes({"attn": AttentionProbe(4)}, first, source_of(planted_maps(10, seed=4)), config, state=state)
    again = source_of(maps)
    train_probes({"attn": AttentionProbe(4)}, again, source_of(planted_maps(10, seed=4)), config, state=state)
    assert again.store_passes == 0  # both epochs came from the state
    assert (again.num_sentences, again.skipped) == (first.num_sentences, first.skipped) == (39, 1)
