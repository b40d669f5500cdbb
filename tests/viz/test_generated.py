"""Attention over a decoder's own continuation: ``head_view(model, prompt, generate=N)`` and
``attnscope view --generate N``, checked against transformers' generation."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import one_line, says, softmax_bound

from attnscope.cli.main import main
from attnscope.models import load_model
from attnscope.models.generation import causal_lm_for
from attnscope.notebook import head_view
from attnscope.viz.generate import continuation_map
from attnscope.viz.payload import page_payload

PROMPT = "the cat sat on the mat and the dog ran to the house"


@pytest.fixture(scope="module", params=["llama", "gpt2"])
def lm(request):
    return load_model(f"debug:{request.param}")


def test_continuation_is_transformers_greedy_and_rows_are_each_steps_attention(lm):
    amap = continuation_map(lm, PROMPT, 4)
    ids = lm.tokenizer(PROMPT).input_ids
    model = causal_lm_for(lm)
    with torch.no_grad():
        g = model.generate(input_ids=torch.tensor([ids]), max_new_tokens=4, do_sample=False,
                           num_beams=1, output_attentions=True, return_dict_in_generate=True,
                           pad_token_id=lm.tokenizer.pad_token_id)
    new = g.sequences[0, len(ids):].tolist()
    assert amap.generated == len(ids) and amap.num_units == len(ids) + len(new)
    assert amap.tokens[len(ids):] == lm.tokenizer.convert_ids_to_tokens(new)
    assert amap.example.fields["generated_ids"] == new
    # step s > 0 read the token generated at step s - 1: its row is row len(ids) + s - 1
    bound = softmax_bound(amap.num_units)  # float32 softmax rows: cached steps vs one pass
    for s, layers in enumerate(g.attentions[1:], start=1):
        row = len(ids) + s - 1
        for layer, a in enumerate(layers):
            np.testing.assert_allclose(amap.attn[layer, :, row, :row + 1], a[0, :, -1].numpy(),
                                       atol=bound, rtol=0)
    # the prompt's rows are the first step's (the prefill)
    for layer, a in enumerate(g.attentions[0]):
        np.testing.assert_allclose(amap.attn[layer, :, :len(ids), :len(ids)], a[0].numpy(), atol=bound, rtol=0)


def test_generated_tokens_are_marked_in_the_payload_and_in_a_window():
    lm = load_model("debug:llama")
    amap = continuation_map(lm, PROMPT, 5)
    g = amap.generated
    p = page_payload(amap)
    assert p["generated"] == [i >= g for i in range(amap.num_units)]
    assert p["text"] == f"{PROMPT} \u2192 (generated) {amap.example.fields['continuation']}"
    # a long input is a window of the last rows (plus the first token): the continuation is in it
    w = page_payload(amap, long_input=8, window=6)
    units = w["window"]["units"]
    assert units == [0] + list(range(amap.num_units - 6, amap.num_units))
    assert w["generated"] == [u >= g for u in units] and sum(w["generated"]) == amap.num_units - g


def test_a_long_continuation_is_windowed_layer_by_layer_as_the_whole_map_would_be(monkeypatch):
    """Past long_input, continuation_map never holds [L H n n]: it reduces each layer while the
    model runs, and the page equals the page page_payload cuts from the whole map."""
    from attnscope.viz.payload import Windowed

    lm = load_model("debug:llama")
    full = continuation_map(lm, PROMPT, 5)
    for offset in (None, 3):
        win = continuation_map(lm, PROMPT, 5, long_input=10, window=8, offset=offset)
        assert isinstance(win, Windowed) and win.num_units == full.num_units
        assert win.amap.attn.shape == (2, 4, 9, 9)  # the first token and 8 rows
        want = page_payload(full, long_input=10, window=8, offset=offset)
        got = page_payload(win, long_input=10, window=8)
        assert got == want
    # no forward pass of the windowed path asked for all layers' maps
    import attnscope.models.capture as capture

    seen = []
    real = capture.forward
    monkeypatch.setattr(capture, "forward", lambda *a, **k: seen.append(k.get("attentions", False)) or real(*a, **k))
    continuation_map(lm, PROMPT, 5, long_input=10, window=8)
    assert seen == [False]


def test_cli_long_continuation_window(tmp_path):
    import json
    import re

    page = tmp_path / "g.html"
    assert main(["view", "--generate", "3", "--model", "debug:llama", "--prompt", PROMPT, "--long-input",
                 "10", "--window", "8", "--offset", "2", "--out", str(page)]) == 0
    data = json.loads(re.search(r'<script id="attnscope-data" type="application/json">(.*?)</script>',
                                page.read_text(), re.S).group(1))
    assert data["window"]["units"] == [0] + list(range(2, 10)) and data["window"]["offset"] == 2


def test_errors_are_one_line(tmp_path, capsys):
    from attnscope.errors import AttnscopeError

    with pytest.raises(AttnscopeError) as e:
        continuation_map(load_model("debug:bert"), PROMPT, 3)
    says(one_line(e.value), "generate 3", "debug:bert", "decoder")
    with pytest.raises(AttnscopeError) as e:
        continuation_map(load_model("debug:llama"), PROMPT, 3, max_seq_len=20)
    says(one_line(e.value), "generate 3", "limit of 20")
    assert e.value.params == ("generate",)
    out = tmp_path / "g.html"
    assert main(["view", "--generate", "3", "--out", str(out)]) == 2
    says(one_line(capsys.readouterr().err.strip()), "error: ", "generate", "--model", "--prompt", "store")
    assert main(["view", "--generate", "3", "--model", "debug", "--prompt", "the cat", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    says(err[0], "debug", "decoder")
    assert main(["view", "--generate", "0", "--model", "debug:llama", "--prompt", "x", "--out", str(out)]) == 2
    assert not out.exists()
    capsys.readouterr()
    inp = tmp_path / "in.txt"
    inp.write_text('{"text": "the cat sat"}\n')
    assert main(["extract", str(inp), "--model", "debug:llama", "--out", str(tmp_path / "s")]) == 0
    capsys.readouterr()
    assert main(["view", str(tmp_path / "s"), "--prompt", "x", "--out", str(out)]) == 2
    says(one_line(capsys.readouterr().err.strip()), "error: ", "--prompt", "--generate")
    assert not out.exists()


def test_cli_continues_a_stored_example_with_the_stores_model(tmp_path):
    inp = tmp_path / "in.txt"
    inp.write_text('{"text": "the cat sat on the mat"}\n')
    store = tmp_path / "maps"
    assert main(["extract", str(inp), "--model", "debug:llama", "--out", str(store)]) == 0
    page = tmp_path / "g.html"
    assert main(["view", str(store), "--generate", "3", "--out", str(page)]) == 0
    want = continuation_map(load_model("debug:llama"), "the cat sat on the mat", 3)
    html = page.read_text()
    assert '"generated":[' + ",".join("true" if i >= want.generated else "false"
                                      for i in range(want.num_units)) + "]" in html


@pytest.mark.browser
def test_generated_tokens_are_drawn_marked(browser, tmp_path):
    lm = load_model("debug:llama")
    amap = continuation_map(lm, PROMPT, 4)
    view = head_view(lm, PROMPT, generate=4)
    assert view.caption.endswith(f"\u00b7 {amap.num_units} tokens \u00b7 {amap.num_units - amap.generated} generated")
    path = view.save(tmp_path / "g.html")
    page = browser.new_page()
    page.goto(path.as_uri())
    page.wait_for_selector("#attnscope-root[data-ready=true]")
    marked = page.eval_on_selector_all(".as-head-view .as-q text.as-generated",
                                       "ts => ts.map(t => +t.getAttribute('data-unit'))")
    assert marked == list(range(amap.generated, amap.num_units))
    assert page.locator(".as-generated-note").inner_text().startswith(f"{amap.num_units - amap.generated} generated tokens")
    page.close()


@pytest.mark.slow
def test_smollm2_continues_a_prompt(smollm2):
    from attnscope.models.generation import greedy_continue

    lm = smollm2
    prompt = "The capital of France is"
    amap = continuation_map(lm, prompt, 6)
    ids = lm.tokenizer(prompt).input_ids
    new = greedy_continue(causal_lm_for(lm), ids, 6)
    assert amap.example.fields["generated_ids"] == new and amap.generated == len(ids)
    assert "Paris" in amap.example.fields["continuation"]
    assert amap.attn.shape == (30, 9, len(ids) + len(new), len(ids) + len(new))
    v = head_view(lm, prompt, generate=6, layer=29)
    assert '"generated":[' in v.html


@pytest.mark.slow
def test_smollm2_long_continuation_is_a_window(smollm2, shared_data):
    """About 700 tokens of WikiText and 4 generated: past 512 units, so the page is the window
    of the last 256 rows, cut layer by layer, with the continuation marked at its end."""
    from attnscope.notebook import _maps
    from attnscope.viz.payload import Windowed

    lm = smollm2
    lines = (shared_data / "wikitext-2" / "valid.sentences.txt").read_text().splitlines()
    prompt = ""
    for line in lines:
        prompt += line + "\n"
        if len(lm.tokenizer(prompt).input_ids) > 700:
            break
    win = _maps(lm, prompt, generate=4)
    assert isinstance(win, Windowed) and win.num_units > 700 and win.size == 256
    assert win.amap.attn.shape == (30, 9, 257, 257) and win.thumbnails.shape == (30, 9, 32, 32)
    g = win.amap.generated
    assert win.amap.num_units - g == len(win.amap.example.fields["generated_ids"])
    assert win.units[g] == win.num_units - (win.amap.num_units - g)
    # a row's float32 weights, shown and outside the window, add up to 1
    np.testing.assert_allclose(win.amap.attn.sum(-1) + win.outside, 1.0, atol=softmax_bound(win.num_units), rtol=0)


@pytest.mark.parametrize("layer", [1, 2])
def test_cli_generate_opens_on_the_layer_the_flag_names(tmp_path, layer):
    """`view --generate ... --layer 29` showed "layer 30": the flag is 1-indexed, as the page's
    caption and layer menu are, and the page opens on that layer's weights."""
    import json
    import re

    from attnscope.viz.encoding import decode

    page = tmp_path / "g.html"
    assert main(["view", "--generate", "3", "--model", "debug:llama", "--prompt", PROMPT, "--layer",
                 str(layer), "--out", str(page)]) == 0
    data = json.loads(re.search(r'<script id="attnscope-data" type="application/json">(.*?)</script>',
                                page.read_text(), re.S).group(1))
    assert data["state"]["layer"] + 1 == layer
    amap = continuation_map(load_model("debug:llama"), PROMPT, 3)
    np.testing.assert_allclose(decode(data["attn"])[data["state"]["layer"]], amap.attn[layer - 1],
                               atol=0.5 / 255 + softmax_bound(amap.num_units))  # 1/255 steps of two float32 runs
