"""Tiny random models built in memory from a config and a small hand-written vocabulary.

They are what the paper's code calls ``--debug``: fast enough for tests, real architectures
(BERT with WordPiece, RoBERTa and GPT-2 with byte-level BPE), seeded, so their attention is
reproducible. They know only a few dozen words; anything else splits into pieces, which is
what the word-level tests want.
"""

from __future__ import annotations

import hashlib

from attnscope.errors import ModelError
from attnscope.models.families import family_for
from attnscope.models.forward import install
from attnscope.models.loaded import LoadedModel, seed_everything

_WORDS = (
    "the a an of to and in is was it that he she they his her their this on for with as at by "
    "from be are cat dog sat mat ran saw man woman house big small red old new said who what "
    "when where because not but or if then there here one two three"
).split()
_SUFFIXES = ["s", "ed", "ing", "er", "ly", "es", "ion"]
_CHARS = list("abcdefghijklmnopqrstuvwxyz0123456789")
_PUNCT = list(".,;:!?'\"()-[]<>/&@#$%*+=_")

TINY = {"hidden": 32, "layers": 2, "heads": 2, "intermediate": 64, "positions": 512}
#: Tiny decoder LLMs: 4 query heads; key/value heads per family (grouped-query attention for
#: Llama and Qwen2, one shared key/value head, i.e. multi-query, for Gemma).
DECODERS = {"llama": ("LlamaConfig", "LlamaModel", 2), "qwen2": ("Qwen2Config", "Qwen2Model", 2),
            "gemma": ("GemmaConfig", "GemmaModel", 1)}
#: Tiny encoder-decoder models (with their language-model head, so they can generate): 2 encoder
#: and 2 decoder layers x 2 heads.
SEQ2SEQ = ("t5", "bart")
#: the hand-made debug families (any other ``debug:<model type>`` is :func:`attnscope.models.tiny.build_tiny`)
TINY_FAMILIES = ("bert", "roberta", "mpnet", "deberta", "luke", "gpt2", *DECODERS, *SEQ2SEQ)


def _wordpiece_vocab(specials: list[str]) -> dict[str, int]:
    vocab_list = specials + _PUNCT + _CHARS + ["##" + c for c in _CHARS] + _WORDS + [
        "##" + s for s in _SUFFIXES]
    return {w: i for i, w in enumerate(dict.fromkeys(vocab_list))}


def _wordpiece_tokenizer():
    from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers, processors
    from tokenizers.models import WordPiece
    from transformers import PreTrainedTokenizerFast

    vocab = _wordpiece_vocab(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])
    tok = Tokenizer(WordPiece(vocab, unk_token="[UNK]", max_input_chars_per_word=100))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True, strip_accents=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    cls, sep = vocab["[CLS]"], vocab["[SEP]"]
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    tok.decoder = decoders.WordPiece()
    from transformers import BertTokenizerFast

    del PreTrainedTokenizerFast
    return BertTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]",
                             cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]",
                             do_lower_case=True)


def _mpnet_tokenizer():
    """MPNet's own tokenizer class over the debug WordPiece vocabulary: ``<s> A </s></s> B </s>``."""
    from transformers import MPNetTokenizerFast

    return MPNetTokenizerFast(vocab=_wordpiece_vocab(["<s>", "<pad>", "</s>", "[UNK]", "<mask>"]))


def _bpe_tokenizer(kind: str):
    from tokenizers import Tokenizer, decoders, pre_tokenizers, processors
    from tokenizers.models import BPE

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    merges: list[tuple[str, str]] = []
    vocab_list = list(alphabet)
    for word in _WORDS:  # merge every known word left to right, with and without a leading space
        for form in (word, "Ġ" + word):
            current = form[0]
            for ch in form[1:]:
                pair = (current, ch)
                current = current + ch
                if pair not in merges:
                    merges.append(pair)
                    vocab_list.append(current)
    if kind == "roberta":
        specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    elif kind == "llama":
        specials = ["<pad>", "<s>", "</s>", "<unk>"]
    elif kind == "t5":
        specials = ["<pad>", "</s>", "<unk>"]
    else:
        specials = ["<|endoftext|>"]
    vocab = {w: i for i, w in enumerate(dict.fromkeys(specials + vocab_list))}
    tok = Tokenizer(BPE(vocab, merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    if kind == "roberta":
        from transformers import RobertaTokenizerFast

        tok.post_processor = processors.RobertaProcessing(("</s>", vocab["</s>"]), ("<s>", vocab["<s>"]),
                                                          add_prefix_space=False, trim_offsets=True)
        return RobertaTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                    sep_token="</s>", cls_token="<s>", unk_token="<unk>",
                                    pad_token="<pad>", mask_token="<mask>")
    if kind == "llama":  # decoder LLMs: BOS first, no [CLS]/[SEP]
        from transformers import PreTrainedTokenizerFast

        tok.post_processor = processors.TemplateProcessing(
            single="<s> $A", pair="<s> $A $B", special_tokens=[("<s>", vocab["<s>"])])
        return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                       unk_token="<unk>", pad_token="<pad>")
    if kind == "t5":  # T5: no BOS, EOS last; pad is also the decoder's start token
        from transformers import PreTrainedTokenizerFast

        tok.post_processor = processors.TemplateProcessing(
            single="$A </s>", pair="$A </s> $B </s>", special_tokens=[("</s>", vocab["</s>"])])
        return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="</s>", unk_token="<unk>",
                                       pad_token="<pad>")
    from transformers import GPT2TokenizerFast

    t = GPT2TokenizerFast(tokenizer_object=tok, bos_token="<|endoftext|>", eos_token="<|endoftext|>",
                          unk_token="<|endoftext|>")
    t.pad_token = t.eos_token
    return t


def build_debug_model(family: str = "bert", *, mlm_head: bool = False, seed: int = 0) -> LoadedModel:
    """A tiny random model of ``family``: "bert", "roberta", "gpt2" or "mpnet" (2 layers x 2
    heads), a decoder LLM "llama", "qwen2" or "gemma" (2 layers x 4 query heads, see
    :data:`DECODERS`), an encoder-decoder "t5" or "bart" (:data:`SEQ2SEQ`), "deberta" (DeBERTa
    v1, relative positions c2p and p2c) or "luke" (LUKE, read on words without entities), both
    with BERT's tokenizer. LUKE's transformers code computes its attention itself (words and
    entities in one), outside ``AttentionInterface``, and has no adapter, so ``debug:luke`` is the model whose heads cannot
    be hooked: only its attention maps come out (:func:`attnscope.models.forward.supports_hooks`
    is False). MPNet's and DeBERTa's are hooked through their adapters
    (:mod:`attnscope.models.adapters`)."""
    import torch
    import transformers

    seed_everything(seed)
    if family == "bert":
        tokenizer = _wordpiece_tokenizer()
        config = transformers.BertConfig(
            vocab_size=len(tokenizer), hidden_size=TINY["hidden"], num_hidden_layers=TINY["layers"],
            num_attention_heads=TINY["heads"], intermediate_size=TINY["intermediate"],
            max_position_embeddings=TINY["positions"], type_vocab_size=2)
        cls = transformers.BertForMaskedLM if mlm_head else transformers.BertModel
    elif family == "roberta":
        tokenizer = _bpe_tokenizer("roberta")
        config = transformers.RobertaConfig(
            vocab_size=len(tokenizer), hidden_size=TINY["hidden"], num_hidden_layers=TINY["layers"],
            num_attention_heads=TINY["heads"], intermediate_size=TINY["intermediate"],
            max_position_embeddings=TINY["positions"] + 2, type_vocab_size=1, pad_token_id=1,
            bos_token_id=0, eos_token_id=2)
        cls = transformers.RobertaForMaskedLM if mlm_head else transformers.RobertaModel
    elif family == "mpnet":
        tokenizer = _mpnet_tokenizer()
        config = transformers.MPNetConfig(
            vocab_size=len(tokenizer), hidden_size=TINY["hidden"], num_hidden_layers=TINY["layers"],
            num_attention_heads=TINY["heads"], intermediate_size=TINY["intermediate"],
            max_position_embeddings=TINY["positions"] + 2, pad_token_id=tokenizer.pad_token_id,
            bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
        cls = transformers.MPNetForMaskedLM if mlm_head else transformers.MPNetModel
    elif family == "luke":  # (with BERT's tokenizer: the maps-only model)
        tokenizer = _wordpiece_tokenizer()
        config = transformers.LukeConfig(
            vocab_size=len(tokenizer), hidden_size=TINY["hidden"], num_hidden_layers=TINY["layers"],
            num_attention_heads=TINY["heads"], intermediate_size=TINY["intermediate"],
            max_position_embeddings=TINY["positions"] + tokenizer.pad_token_id + 1, type_vocab_size=2,
            pad_token_id=tokenizer.pad_token_id, entity_vocab_size=8, entity_emb_size=TINY["hidden"])
        cls = transformers.LukeForMaskedLM if mlm_head else transformers.LukeModel
    elif family == "deberta":  # (DeBERTa v1, with BERT's tokenizer)
        tokenizer = _wordpiece_tokenizer()
        config = transformers.DebertaConfig(
            vocab_size=len(tokenizer), hidden_size=TINY["hidden"], num_hidden_layers=TINY["layers"],
            num_attention_heads=TINY["heads"], intermediate_size=TINY["intermediate"],
            max_position_embeddings=TINY["positions"], type_vocab_size=2, pad_token_id=tokenizer.pad_token_id,
            relative_attention=True, pos_att_type=["c2p", "p2c"], max_relative_positions=16)
        cls = transformers.DebertaForMaskedLM if mlm_head else transformers.DebertaModel
    elif family == "gpt2":
        if mlm_head:
            raise ModelError("debug:gpt2: a causal model has no masked-LM head")
        tokenizer = _bpe_tokenizer("gpt2")
        config = transformers.GPT2Config(
            vocab_size=len(tokenizer), n_embd=TINY["hidden"], n_layer=TINY["layers"],
            n_head=TINY["heads"], n_positions=TINY["positions"], bos_token_id=0, eos_token_id=0)
        cls = transformers.GPT2Model
    elif family in DECODERS:
        if mlm_head:
            raise ModelError(f"debug:{family}: a causal model has no masked-LM head")
        tokenizer = _bpe_tokenizer("llama")
        config_name, model_name, kv_heads = DECODERS[family]
        config = getattr(transformers, config_name)(
            vocab_size=len(tokenizer), hidden_size=TINY["hidden"], num_hidden_layers=TINY["layers"],
            num_attention_heads=4, num_key_value_heads=kv_heads, head_dim=TINY["hidden"] // 4,
            intermediate_size=TINY["intermediate"], max_position_embeddings=TINY["positions"],
            pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            initializer_range=0.3)  # larger than the default 0.02, so heads are not near-uniform
        cls = getattr(transformers, model_name)
    elif family in SEQ2SEQ:
        if mlm_head:
            raise ModelError(f"debug:{family}: an encoder-decoder model has no masked-LM head")
        tokenizer = _bpe_tokenizer("roberta" if family == "bart" else "t5")
        pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
        if family == "bart":
            config = transformers.BartConfig(
                vocab_size=len(tokenizer), d_model=TINY["hidden"], encoder_layers=TINY["layers"],
                decoder_layers=TINY["layers"], encoder_attention_heads=TINY["heads"],
                decoder_attention_heads=TINY["heads"], encoder_ffn_dim=TINY["intermediate"],
                decoder_ffn_dim=TINY["intermediate"], max_position_embeddings=TINY["positions"],
                pad_token_id=pad, bos_token_id=tokenizer.bos_token_id, eos_token_id=eos,
                decoder_start_token_id=eos, forced_eos_token_id=None, init_std=0.3)
            cls = transformers.BartForConditionalGeneration
        else:
            config = transformers.T5Config(
                vocab_size=len(tokenizer), d_model=TINY["hidden"], d_kv=TINY["hidden"] // TINY["heads"],
                d_ff=TINY["intermediate"], num_layers=TINY["layers"], num_decoder_layers=TINY["layers"],
                num_heads=TINY["heads"], pad_token_id=pad, eos_token_id=eos,
                decoder_start_token_id=pad, initializer_factor=3.0)
            cls = transformers.T5ForConditionalGeneration
    else:  # any other model type transformers ships: its own config class, shrunk
        from attnscope.models.tiny import build_tiny

        tokenizer = _bpe_tokenizer("llama")
        try:
            model = build_tiny(family, tokenizer, seed=seed, base=not mlm_head)
        except ModelError:
            raise
        except Exception as err:  # transformers' own check of the config or of the model
            raise ModelError(f"debug:{family}: transformers could not build a tiny model of it "
                             f"({type(err).__name__}: {str(err).splitlines()[0][:200]})") from None
        config = model.config
    config._attn_implementation = "eager"
    tokenizer.model_max_length = TINY["positions"]
    if family in TINY_FAMILIES:
        torch.manual_seed(seed)
        model = cls(config)
        model.eval()
    install(model)
    h = hashlib.sha256()
    for k, v in sorted(model.state_dict().items()):
        h.update(k.encode())
        h.update(v.detach().cpu().numpy().tobytes())
    return LoadedModel(model=model, tokenizer=tokenizer, family=family_for(config.model_type),
                       name=f"debug:{family}", source=f"debug:{family} (random, seed {seed})",
                       weights_hash=h.hexdigest(), has_mlm_head=mlm_head, extra={"seed": seed})
