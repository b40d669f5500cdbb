"""The long-context family: what a (decoder) model looks at over long documents.

Inputs: long documents (text with a blank line between documents, or JSON / JSON Lines with
``text``), each kept whole up to the run's ``max_seq_len`` (option ``join`` joins consecutive
documents to reach it). The statistics (:mod:`attnscope.analyses.longctx`) come from the
streaming engine (:mod:`attnscope.engines.streaming`) whenever the ``[L H n n]`` maps would not
fit in ``maps_budget_gb``, or from the maps otherwise; ``engine`` forces either. Induction
and duplicate-token scores come from extra sequences of random tokens repeated once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from attnscope.analyses.family_result import FamilyResult
from attnscope.analyses.longctx import LongContextStats, head_clusters
from attnscope.data.unlabeled import prepare_documents
from attnscope.engines import backends
from attnscope.engines.plan import maps_bytes, plan
from attnscope.engines.streaming import induction_sequences
from attnscope.errors import AttnscopeError
from attnscope.extract.encode import token_units
from attnscope.families.base import (
    Context,
    Family,
    Input,
    Prepared,
    check_options,
    option,
    register_family,
)
from attnscope.models.generation import ContinueStep
from attnscope.report.longctx import run_findings, write_section
from attnscope.store.results import write_results
from attnscope.viz.results_views import head_scatter, profiles_from_result, sink_heatmap

#: Tokens per forward pass: long inputs go one (or a few) at a time whatever --batch-size says.
BATCH_TOKENS = 8192


def _batching(lengths: list[int], batch_size: int) -> tuple[int, int]:
    """``(longest, batch size)`` of a group of sequences of these lengths: at most
    ``batch_size``, about :data:`BATCH_TOKENS` tokens, and no more than the group holds."""
    longest = max(lengths)
    return longest, max(1, min(batch_size, BATCH_TOKENS // longest, len(lengths)))


@dataclass
class Options:
    chunk: int = option(0, "Query rows per tile of the streaming engine (memory ~ heads x chunk x "
                           "length floats; the numbers do not depend on it); 0: tiles of about 4 MB.", minimum=0)
    engine: str = option("auto", "Where the statistics come from: the streaming engine (no n x n maps), "
                                 "the attention maps, or auto (maps when they fit in --longctx-maps-budget-gb).",
                         choices=("auto", "streaming", "maps"))
    maps_budget_gb: float = option(2.0, "Largest size of one batch's attention maps for --longctx-engine auto "
                                        "to use them.")
    dtype: str = option("float32", "Precision of the forward pass (bfloat16: autocast, except the "
                                   "attention modules, which --longctx-attention-dtype sets; the "
                                   "statistics are always float32).",
                        choices=("float32", "bfloat16"))
    attention_dtype: str = option("auto", "What the attention scores are made of: auto (the forward "
                                          "pass's dtype, --longctx-dtype), float32 (under --longctx-dtype "
                                          "bfloat16 the attention modules run in float32: the precise "
                                          "statistics, at float32 speed on a GPU) or bfloat16 (the queries, "
                                          "keys and values rounded to bfloat16, as the bare bfloat16 flash "
                                          "forward multiplies them, on a GPU's tensor cores; sums in float32). "
                                          "Streaming engine only.",
                                  choices=("auto", "float32", "bfloat16"))
    backend: str = option("auto", "The streaming engine's backend: auto (by device: attnscope's one-pass "
                                  "Triton kernel on a GPU, FlexAttention where Triton is missing, the "
                                  "compiled kernel on a CPU) or one by name "
                                  "(docs/long-context.md); the statistics do not depend on it beyond rounding.",
                          choices=tuple(n for n in backends.NAMES if n != "maps"))  # maps: --longctx-engine
    join: bool = option(False, "Join consecutive documents (in file order) until --max-seq-len tokens.")
    num_docs: int = option(0, "Use only the first N documents (0: all).", minimum=0)
    js_rows: int = option(8, "Query rows sampled per document (seeded) for the head-to-head "
                             "Jensen-Shannon distances.", minimum=0)
    induction: int = option(4, "Sequences of repeated random tokens for the induction and "
                               "duplicate-token scores (0: none).", minimum=0)
    induction_length: int = option(256, "Random tokens per copy in those sequences.", minimum=1)
    sink_threshold: float = option(0.3, "A sink head's mean attention on the first token is above "
                                        "this (Gu et al. 2024 use 0.3).")
    sink_metric: str = option("pooled", "How sink heads are told: pooled (the mean over every "
                                        "document's rows after the first, pooled) or gu2024 (Gu et al. "
                                        "2024: each document's mean over all its rows, row 0 included, "
                                        "thresholded per document; decoders only).",
                              choices=("pooled", "gu2024"))
    word_level: bool = option(False, "Statistics per word, not per token (paper section 4.1: attention "
                                     "TO a word is the sum over its pieces, FROM a word the mean of its "
                                     "pieces' rows; special tokens stay units of their own).")
    generate: int = option(0, "Continue each document greedily by N tokens with the model (decoders "
                              "only; documents are cut to --max-seq-len minus N first) and analyse "
                              "prompt + continuation; 0: off.", minimum=0)


def attention_dtype(options: Options) -> str:
    """What the scores are made of: ``--longctx-attention-dtype``, or (auto) the forward's dtype."""
    return options.dtype if options.attention_dtype == "auto" else options.attention_dtype


@register_family
class LongContext(Family):
    key = "longctx"
    title = "Long-context attention"
    help = "Sink, previous-token, induction heads, entropy and distance profiles over long documents"
    inputs = (Input("documents", "Long documents: text with a blank line between documents, or "
                                 "JSON / JSON Lines with a 'text' field.", sample="text.txt"),)
    Options = Options
    default_model = "smollm2"
    default_max_seq_len = 4096  # long context (the shared default, 128, is a BERT-sized example)
    order = 70
    demo = False  # beyond the paper; the demo reproduces the paper's analyses

    def view(self, result: FamilyResult, source: str, problems: list[str]) -> dict:
        """Distance and position profiles per head, and the sink-mass heatmap."""
        sink = sink_heatmap(result, source)
        return {"profiles": profiles_from_result(result, source, problems),
                "sinks": [sink] if sink is not None else [],
                "scatter": head_scatter(result, "clusters", "x", "y", "behaviour", source)}

    def prepare(self, inputs: dict[str, Any], options: Options, ctx: Context) -> Prepared:
        path = inputs.get("documents")
        if path is None:
            raise AttnscopeError("documents: no file given", params=("documents",))
        lm = ctx.model
        check_options(options)  # chunk, js_rows, ... at least their minimum, naming the value given
        if options.sink_metric == "gu2024" and not lm.facts.causal:
            raise AttnscopeError(f"sink_metric gu2024: {lm.name} is an encoder; Gu et al.'s metric "
                                 "is defined for decoder (causal) models", params=("sink_metric",))
        if options.generate and not lm.facts.causal:
            raise AttnscopeError(f"generate {options.generate}: {lm.name} is an encoder; only a "
                                 "decoder (causal) model can continue a prompt", params=("generate",))
        if options.generate and options.generate > ctx.max_seq_len - 2:
            raise AttnscopeError(f"generate {options.generate} leaves fewer than 2 prompt tokens "
                                 f"within max_seq_len {ctx.max_seq_len}", params=("generate", "max_seq_len"))
        if options.generate and options.word_level:
            raise AttnscopeError("word_level with generate: generated tokens have no words from "
                                 "the text; use one or the other", params=("word_level", "generate"))
        if not lm.facts.causal and ctx.max_seq_len > lm.max_positions:
            raise AttnscopeError(f"max_seq_len {ctx.max_seq_len} is longer than {lm.name} allows "
                                 f"({lm.max_positions} positions)", params=("max_seq_len",))
        docs = prepare_documents(path, lm.tokenizer, max_seq_len=ctx.max_seq_len - options.generate,
                                 join=options.join,
                                 num_docs=options.num_docs or None)
        if options.word_level and any(d.word_ids is None for d in docs):
            raise AttnscopeError(f"{path}: word_level needs a fast tokenizer (word alignment); "
                                 f"{lm.name}'s has none", params=("word_level",))
        notes: list[str] = []
        probes = (induction_probes(lm, options.induction, options.induction_length, ctx.seed, notes)
                  if options.induction and not options.word_level else ([], []))
        # documents and induction sequences run in batches of their own; the widest decides
        batches = [_batching([len(d.ids) + options.generate for d in docs], ctx.batch_size)] + (
            [_batching([len(s) for s in probes[0]], ctx.batch_size)] if probes[0] else [])
        widest = max(batches, key=lambda b: maps_bytes(lm, *b))
        engine = plan(lm, longest=widest[0], batch_size=widest[1], budget_bytes=int(options.maps_budget_gb * 2 ** 30),
                      engine=options.engine, backend=options.backend, attention_dtype=attention_dtype(options),
                      token_level=not options.word_level, probes=bool(probes[0]),
                      autocast=options.dtype == "bfloat16")
        return Prepared({"documents": docs, "probes": probes, "batches": batches, "notes": notes},
                        weight=sum(len(d.ids) for d in docs) // 128 + 1,
                        counts={"documents": len(docs), "tokens": sum(len(d.ids) for d in docs),
                                "cut": sum(d.cut for d in docs)}, plan=engine)

    def run(self, prepared: Prepared, options: Options, ctx: Context) -> FamilyResult:
        import contextlib

        import torch

        lm, docs, engine = ctx.model, prepared.data["documents"], prepared.plan
        seqs, notes, generated = [d.ids for d in docs], list(prepared.data["notes"]), []
        if options.generate:
            seqs, generated, line = self._continue(lm, seqs, options.generate, ctx)
            notes.append(line)
        units = _word_units(docs, options.induction, notes) if options.word_level else None
        probes, probe_targets = prepared.data["probes"]
        # the sequences with targets (the probes) feed the induction and duplicate scores only,
        # never the document statistics (LongContextStats keeps them apart)
        groups = [(seqs, [None] * len(seqs), "document")] + (
            [(probes, probe_targets, "induction sequence")] if probes else [])
        batches = prepared.data["batches"]
        widest = max(range(len(batches)), key=lambda i: maps_bytes(lm, *batches[i]))
        longest, batch_size = batches[widest]
        stats = LongContextStats(js_rows=options.js_rows, seed=ctx.seed,
                                 sink_threshold=options.sink_threshold, causal=lm.facts.causal,
                                 sink_metric=options.sink_metric)
        autocast = (torch.autocast(device_type=lm.model.device.type, dtype=torch.bfloat16)
                    if options.dtype == "bfloat16" else contextlib.nullcontext())
        total, done, on_workers = sum(len(g) for g, _, _ in groups), 0, 0
        with autocast:
            for (group, targets, _), (_, size) in zip(groups, batches):
                on_workers = ctx.passes.stream(group, stats, step="statistics", chunk=options.chunk,
                                        batch_size=size, targets=None if units else targets,
                                        units=units, start=done, total=total, plan=engine)
                done += len(group)
        res = stats.finalize()
        res.meta["plan"] = engine.describe()
        extra = notes + run_findings(res, options, engine=engine.engine, ray_workers=on_workers, model=lm,
                                     documents=len(docs), doc_longest=batches[0][0], probes=probes,
                                     batch=(batch_size, longest, groups[widest][2]),
                                     maps_gb=maps_bytes(lm, longest, batch_size) / 2 ** 30,
                                     max_seq_len=ctx.max_seq_len, generated=generated,
                                     attention_dtype=attention_dtype(options))
        clusters = head_clusters(res)
        if clusters is not None:  # the MDS placement the viewer's scatter draws
            res.tables["clusters"] = clusters["rows"]
        sec = write_section(res, ctx.out_dir, title=self.title, key=self.key, extra_findings=extra,
                            clusters=clusters)
        write_results(ctx.out_dir, self.key, res)  # strict JSON (store.results)
        return ctx.result(sec)

    @staticmethod
    def _continue(lm, seqs: list[list[int]], new_tokens: int, ctx: Context):
        """Each prompt plus its greedy continuation, a record per document, and one line."""
        conts = [r["ids"] for r in ctx.units.tasks(ContinueStep(new_tokens, seed=ctx.seed), seqs, name="generate",
                                             label="generate", unit="documents")]
        out = [list(ids) + cont for ids, cont in zip(seqs, conts)]
        records = [{"document": i, "generated_from": len(ids), "length": len(ids) + len(cont),
                    "continuation_ids": cont, "continuation": lm.tokenizer.decode(cont, skip_special_tokens=False)}
                   for i, (ids, cont) in enumerate(zip(seqs, conts))]
        shortest = min(len(r["continuation_ids"]) for r in records)
        first = records[0]["continuation"].replace("\n", " ")
        line = (f"Each document was continued greedily by the model ({new_tokens} tokens asked"
                + (f"; at least {shortest} made, a continuation stops at an end-of-sequence token"
                   if shortest < new_tokens else "") + "); statistics cover prompt and continuation; "
                f"document 1 goes on: {first[:120]!r}.")
        return out, records, line


def _word_units(docs, induction: int, notes: list[str]) -> list:
    """Each document's word units (paper section 4.1), with one line for ``notes``."""
    units = [token_units(np.asarray(d.word_ids), np.asarray(d.word_ids) < 0) for d in docs]
    notes.append("Word level: attention TO a word is the sum over its pieces, FROM a word the mean "
                 "of its pieces' rows (paper section 4.1); positions, distances and row lengths "
                 f"count words ({sum(int(u[-1]) + 1 for u in units)} words in "
                 f"{sum(len(d.ids) for d in docs)} tokens)"
                 + ("; the induction sequences (random tokens, not words) were not run."
                    if induction else "."))
    return units


def induction_probes(lm, count: int, length: int, seed: int, notes: list[str]) -> tuple[list, list]:
    """``count`` seeded sequences of ``length`` random tokens repeated once, and their targets
    (:func:`~attnscope.engines.streaming.induction_sequences`); a copy draws distinct ordinary
    tokens and both copies must fit the model's positions (a shorter copy is noted)."""
    tok = lm.tokenizer
    ordinary = len(tok) - len(set(getattr(tok, "all_special_ids", []) or []))
    half = min(length, ordinary - 1, (lm.max_positions - 1) // 2)
    if half < length:
        notes.append(f"Induction sequences use {half} random tokens per copy, not {length}: the "
                     "model's vocabulary or positions allow no more.")
    return induction_sequences(lm, count, half, seed=seed)
