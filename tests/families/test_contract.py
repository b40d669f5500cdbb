"""The contract every registered analysis and every registered family keeps (in the spirit of
scikit-learn's ``parametrize_with_checks``): a new analysis or family is covered the moment it
is registered, with no line added here.

Analyses: empty input, one example, merge of two halves equals the whole, any batching gives
the same result, a strict-JSON round trip, and the result carries its parameters and seeds.
Families: each runs on the packaged sample of its first input, writes a strict-JSON
``results/<key>.json`` that reads back like every other result, and gives the same numbers
twice with the same seed.
"""

from __future__ import annotations

import inspect
import json
import math

import numpy as np
import pytest

from attnscope.analyses import ANALYSES
from attnscope.families import load_families
from attnscope.store.results import dumps

ANALYSIS_NAMES = sorted(ANALYSES)  # complete on import: attnscope.analyses imports every module


def test_the_registry_is_complete_on_import_and_holds_every_analysis_class():
    """Nothing else registers an analysis (a fresh interpreter sees every name without loading
    the families), and every concrete analysis class anywhere in attnscope is registered."""
    import importlib
    import pkgutil
    import subprocess
    import sys

    import attnscope
    from attnscope.analyses.base import Analysis

    fresh = subprocess.run([sys.executable, "-c", "from attnscope.analyses import ANALYSES; "
                            "print(' '.join(sorted(ANALYSES)))"], capture_output=True, text=True, check=True)
    assert fresh.stdout.split() == ANALYSIS_NAMES
    for info in pkgutil.walk_packages(attnscope.__path__, prefix="attnscope."):
        if not info.name.startswith(("attnscope.cli", "attnscope.serve", "attnscope.__main__")):
            importlib.import_module(info.name)
    load_families()
    assert sorted(ANALYSES) == ANALYSIS_NAMES

    def concrete(cls):
        for sub in cls.__subclasses__():
            if not inspect.isabstract(sub):
                yield sub
            yield from concrete(sub)

    unregistered = {c.__qualname__ for c in concrete(Analysis) if c.__module__.startswith("attnscope.")
                    and ANALYSES.get(getattr(c, "name", None)) is not c}
    assert not unregistered
    assert {"figure-1-example", "key-concentration", "streamed-general"} <= set(ANALYSIS_NAMES)


def test_every_declared_requirement_is_known_and_a_causal_only_analysis_refuses_an_encoder(mlm_bert):
    from attnscope.analyses.base import REQUIREMENTS
    from attnscope.errors import AttnscopeError

    for name, cls in ANALYSES.items():
        assert cls.requires <= set(REQUIREMENTS), name
    causal = [name for name, cls in ANALYSES.items() if "causal" in cls.requires]
    assert "streamed-general" in causal
    for name in causal:
        with pytest.raises(AttnscopeError, match="not causal"):
            _build(name, mlm_bert)


@pytest.fixture(scope="module")
def mlm_bert():
    from attnscope.models import load_model

    return load_model("debug:bert", mlm_head=True)


def _examples(requires: frozenset, model) -> list:
    """Small real inputs that satisfy ``requires``: dependency trees from the packaged sample,
    or its coreference document cut into windows."""
    from attnscope.data.depparse import iter_depparse
    from attnscope.pipeline import demo_inputs

    if "coreference" in requires:
        from attnscope.analyses.coref import coref_windows
        from attnscope.data.coref import read_coref

        docs = read_coref(demo_inputs()["coref"])
        examples, _ = coref_windows(docs, model, mode="sliding", max_seq_len=64)
        return examples[:6]
    return list(iter_depparse(demo_inputs()["deps"]))[:6]


@pytest.fixture(scope="module")
def model_for(mlm_bert, debug_llama):
    """The model an analysis is built and fed with: a causal one (debug_llama) when it
    requires ``causal``, else a BERT with its masked-LM head."""
    return lambda name: debug_llama if "causal" in ANALYSES[name].requires else mlm_bert


@pytest.fixture(scope="module")
def batches_for(model_for):
    from attnscope.extract import extract

    cache: dict = {}

    def get(name: str) -> list:
        """What ``update`` of analysis ``name`` consumes, one item per example: maps, or
        encoded examples for analyses that run the model themselves."""
        cls = ANALYSES[name]
        model = model_for(name)
        word = "word_level" in cls.requires
        key = (word, "coreference" in cls.requires, cls.consumes, model.name)
        if key not in cache:
            examples = _examples(cls.requires, model)
            if cls.consumes == "encoded":
                from attnscope.extract.encode import Encoder

                encoder = Encoder(model)
                cache[key] = [encoder.encode(ex, i) for i, ex in enumerate(examples)]
            else:
                cache[key] = [m for b in extract(examples, model, word_level=word, batch_size=4,
                                                 max_seq_len=128) for m in b]
        return cache[key]

    return get


def _feed(name: str, items):
    """One ``update`` argument: an AttentionBatch of maps, or a list of encoded examples."""
    from attnscope.extract import AttentionBatch

    return AttentionBatch(list(items)) if ANALYSES[name].consumes == "maps" else list(items)


def _equal(a, b, path="result", rel=1e-9):
    """Recursive equality: floats to ``rel`` relative, NaN equal to NaN (and to null after JSON)."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        np.testing.assert_allclose(np.asarray(a, dtype=float), np.asarray(b, dtype=float),
                                   rtol=rel, atol=rel * 1e-3, equal_nan=True, err_msg=path)
        return
    if isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), (path, sorted(a), sorted(b))
        for k in a:
            _equal(a[k], b[k], f"{path}.{k}", rel)
        return
    if isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            _equal(x, y, f"{path}[{i}]", rel)
        return
    def nan(v):
        return v is None or (isinstance(v, float) and math.isnan(v))

    if isinstance(a, float) or isinstance(b, float):
        if nan(a) or nan(b):
            assert nan(a) and nan(b), (path, a, b)
        else:
            assert a == pytest.approx(b, rel=rel, abs=rel * 1e-3), (path, a, b)
        return
    assert a == b, (path, a, b)


def _plain(result) -> dict:
    return json.loads(dumps(result.to_json()))


def _build(name, model):
    return ANALYSES[name].for_model(model, seed=0)


@pytest.mark.parametrize("name", ANALYSIS_NAMES)
def test_empty_input_and_one_example(name, model_for, batches_for):
    empty = _build(name, model_for(name)).finalize()
    assert empty.analysis == name
    json.loads(dumps(empty.to_json()))  # serialises even with nothing accumulated
    maps = batches_for(name)
    one = _build(name, model_for(name))
    one.update(_feed(name, maps[:1]))
    res = one.finalize()
    assert res.analysis == name
    assert res.tables or res.arrays  # one example gives numbers


def _batching_tolerance(name: str) -> float:
    """Maps are summed in float64: any batching gives the whole to 1e-9. An analysis that runs
    the model itself (``consumes == "encoded"``) gets float32 forwards whose padded batch shape
    changes the matrix products' blocking, so batching moves its numbers by float32 rounding
    (seen: up to 1.6e-8 relative on an AMD EPYC): 1e-6."""
    return 1e-6 if ANALYSES[name].consumes == "encoded" else 1e-9


@pytest.mark.parametrize("name", ANALYSIS_NAMES)
def test_merge_of_halves_and_any_batching_equal_the_whole(name, model_for, batches_for):
    rel = _batching_tolerance(name)
    maps = batches_for(name)
    whole = _build(name, model_for(name))
    whole.update(_feed(name, maps))
    expected = _plain(whole.finalize())

    one_by_one = _build(name, model_for(name))
    for m in maps:
        one_by_one.update(_feed(name, [m]))
    _equal(_plain(one_by_one.finalize()), expected, f"{name} one by one", rel)

    half = len(maps) // 2
    a, b = _build(name, model_for(name)), _build(name, model_for(name))
    a.update(_feed(name, maps[:half]))
    b.update(_feed(name, maps[half:]))
    _equal(_plain(a.merge(b).finalize()), expected, f"{name} merged", rel)


@pytest.mark.parametrize("name", ANALYSIS_NAMES)
def test_json_round_trip_params_and_seed(name, model_for, batches_for):
    from attnscope.analyses.base import Result

    analysis = _build(name, model_for(name))
    analysis.update(_feed(name, batches_for(name)[:3]))
    res = analysis.finalize()
    text = dumps(res.to_json())
    back = Result.from_json(json.loads(text))
    _equal(_plain(back), json.loads(text), f"{name} round trip")
    for k, arr in res.arrays.items():
        assert back.arrays[k].shape == arr.shape and back.arrays[k].dtype == arr.dtype
    assert json.loads(dumps(res.params)) == json.loads(dumps(analysis.params()))
    if "seed" in inspect.signature(ANALYSES[name].__init__).parameters:
        assert res.params.get("seed") == 0, f"{name} does not record its seed"


# -- families -------------------------------------------------------------------------------
FAMILY_KEYS = [f.key for f in load_families()]


def _sample(inp):
    from importlib.resources import files
    from pathlib import Path

    if inp.sample is None:
        pytest.skip(f"input {inp.name!r} names no packaged sample")
    return Path(str(files("attnscope") / "demo_data" / inp.sample))


@pytest.mark.heavy  # a whole run of each family: 2-20 s each
@pytest.mark.parametrize("key", FAMILY_KEYS)
def test_family_runs_on_its_sample_and_writes_strict_results(key, tmp_path, mlm_bert, debug_llama):
    from attnscope.analyses.base import Result
    from attnscope.families import FAMILIES
    from attnscope.pipeline import run_family

    fam = FAMILIES[key]
    first = fam.inputs[0]
    sample = _sample(first)
    inputs = {first.name: [sample] if first.multiple else sample}
    def refuse(constant):
        raise AssertionError(f"results/{key}.json is not strict JSON ({constant})")

    outs = []
    for run in ("a", "b"):
        model = debug_llama if fam.causal_only else mlm_bert
        section = run_family(key, inputs, tmp_path / run, model=model, seed=0, **fam.sample_options)
        assert section.key == key and section.title
        path = tmp_path / run / "results" / f"{key}.json"
        d = json.loads(path.read_text(encoding="utf-8"), parse_constant=refuse)
        result = Result.from_json(d)
        assert result.analysis and isinstance(result.params, dict)
        outs.append(d)
    volatile = {"seconds", "seconds_per_epoch", "seconds_per_step", "analysis_seconds", "elapsed_s", "timing"}

    def strip(x):
        if isinstance(x, dict):
            return {k: strip(v) for k, v in x.items() if k not in volatile}
        if isinstance(x, list):
            return [strip(v) for v in x]
        return x

    _equal(strip(outs[0]), strip(outs[1]), f"{key}: same seed, same numbers")
