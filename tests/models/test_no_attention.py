"""A model that returned no attention (transformers' default sdpa attention gives empty tuples
for ``output_attentions=True``) gets one clear error, and the same model handed to attnscope
with its tokenizer and text works (issue 36)."""

from __future__ import annotations

import copy
import warnings

import numpy as np
import pytest
import torch
import transformers
from conftest import one_line, says, softmax_bound

from attnscope.errors import ModelError, NoAttentionError
from attnscope.notebook import _maps, head_view, model_view


@pytest.fixture(scope="module")
def bert_tokenizer():
    from attnscope.models import load_model

    return load_model("debug:bert").tokenizer


def _bert(tokenizer, attn_implementation: str | None = None):
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=16, num_hidden_layers=2,
                                     num_attention_heads=2, intermediate_size=16)
    model = transformers.BertModel(config).eval()
    if attn_implementation:
        model.set_attn_implementation(attn_implementation)
    return model


def test_bertviz_call_with_empty_attention_names_both_ways_out(bert_tokenizer):
    bert = _bert(bert_tokenizer)  # transformers' default: sdpa
    assert bert.config._attn_implementation == "sdpa"
    enc = bert_tokenizer("the cat sat", return_tensors="pt")
    out = bert(**enc, output_attentions=True)
    assert len(out.attentions) == 0  # what transformers >= 5.24 returns under sdpa
    tokens = bert_tokenizer.convert_ids_to_tokens(enc["input_ids"][0])
    for attention in (out.attentions, None, [None, None]):
        with pytest.raises(NoAttentionError) as err:
            head_view(attention, tokens)
        message = str(err.value)
        assert "\n" not in message
        assert 'attn_implementation="eager"' in message and "tokenizer=tokenizer" in message


def test_encoder_decoder_keywords_with_empty_attention_name_the_empty_one():
    torch.manual_seed(0)
    t5 = transformers.T5ForConditionalGeneration(transformers.T5Config(
        vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=4)).eval()
    src, tgt = torch.tensor([[5, 6, 7, 8, 1]]), torch.tensor([[0, 9, 10]])
    o = t5(input_ids=src, decoder_input_ids=tgt, output_attentions=True)
    et, dt = [f"e{i}" for i in range(5)], [f"d{i}" for i in range(3)]
    with pytest.raises(NoAttentionError) as e:
        head_view(encoder_attention=o.encoder_attentions, decoder_attention=o.decoder_attentions,
                  cross_attention=o.cross_attentions, encoder_tokens=et, decoder_tokens=dt)
    # the empty keyword (and no other), why, and the fix
    says(one_line(e.value), "encoder_attention", "empty", 'attn_implementation="eager"')
    assert "decoder_attention" not in str(e.value) and "cross_attention" not in str(e.value)
    # the same model on eager attention draws all three, cross-attention included
    t5.set_attn_implementation("eager")
    o = t5(input_ids=src, decoder_input_ids=tgt, output_attentions=True)
    maps = _maps(None, None, encoder_attention=o.encoder_attentions, decoder_attention=o.decoder_attentions,
                 cross_attention=o.cross_attentions, encoder_tokens=et, decoder_tokens=dt)
    assert maps["cross"].attn.shape == (2, 4, 3, 5)
    np.testing.assert_allclose(maps["cross"].attn[1], o.cross_attentions[1][0].detach().numpy())


def test_a_default_loaded_model_handed_over_gives_its_eager_attention(bert_tokenizer):
    bert = _bert(bert_tokenizer)
    amap = _maps(bert, "the cat sat on the mat", tokenizer=bert_tokenizer)
    assert bert.config._attn_implementation == "sdpa"  # restored after the capture
    enc = bert_tokenizer("the cat sat on the mat", return_tensors="pt")
    eager = _bert(bert_tokenizer, attn_implementation="eager")
    expected = torch.stack(eager(**enc, output_attentions=True).attentions)[:, 0]  # [L H n n]
    # float32 softmax rows of the same scores by two passes
    np.testing.assert_allclose(amap.attn, expected.detach().numpy(), atol=softmax_bound(amap.attn.shape[-1]), rtol=0)
    assert amap.tokens == bert_tokenizer.convert_ids_to_tokens(enc["input_ids"][0])
    assert "the" in head_view(bert, "the cat sat", tokenizer=bert_tokenizer).html


def test_a_default_loaded_decoder_generates_without_a_warning(debug_llama):
    torch.manual_seed(0)
    # a copy of the config: the session's debug_llama shares it, and must keep attnscope's attention
    llama = transformers.LlamaForCausalLM(copy.deepcopy(debug_llama.model.config)).eval()
    llama.set_attn_implementation("sdpa")  # the debug config says attnscope's: as loaded by default
    tok = debug_llama.tokenizer
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        amap = _maps(llama, "the cat sat on the", tokenizer=tok, generate=4)
        model_view(llama, "the cat sat on the", tokenizer=tok, generate=4)
    assert [str(w.message) for w in caught] == []
    prompt = tok("the cat sat on the")["input_ids"]
    with torch.no_grad():  # transformers' own greedy decoding gives the same continuation
        ref = llama.generate(torch.tensor([prompt]), max_new_tokens=4, do_sample=False,
                             min_new_tokens=0, pad_token_id=0)[0, len(prompt):].tolist()
    assert amap.example.fields["generated_ids"] == ref[:len(amap.example.fields["generated_ids"])]
    assert amap.generated == len(prompt)
    np.testing.assert_allclose(amap.attn.sum(-1), 1.0, atol=softmax_bound(amap.attn.shape[-1]), rtol=0)  # a row's weights
    assert llama.config._attn_implementation == "sdpa"


def test_a_model_without_its_tokenizer_is_refused(bert_tokenizer):
    with pytest.raises(ModelError, match="tokenizer="):
        head_view(_bert(bert_tokenizer), "the cat sat")


@pytest.mark.parametrize("model_type", ["rwkv", "yoso"])
def test_output_attentions_that_are_not_maps_are_refused_as_no_attention(model_type):
    # RWKV's and YOSO's output_attentions are [1 n D] tensors, not [1 H n keys] maps: read as maps
    # they gave a "bidirectional" model and a head view that failed on a numpy IndexError
    from attnscope.models import load_model

    with pytest.raises(ModelError) as err:
        load_model(f"debug:{model_type}")
    says(one_line(err.value), f"debug:{model_type}", "returned no attention maps", "entry is shaped [1, ",
         "not [batch, heads, n, keys]")


def test_layers_with_different_numbers_of_heads_are_refused_naming_them():
    from attnscope.models import load_model

    with pytest.raises(ModelError) as err:
        load_model("debug:inkling_text")
    says(one_line(err.value), "debug:inkling_text", "different numbers of heads (64, 4)")


def test_a_model_without_a_position_table_reads_512_tokens_and_its_head_view_renders():
    # XLNet's max_position_embeddings is -1 (relative positions): read as a limit it left no token
    from attnscope.models import load_model

    lm = load_model("debug:xlnet")
    assert lm.model.config.max_position_embeddings == -1 and lm.max_positions == 512
    assert "sat" in head_view(lm, "the cat sat on the mat").html
