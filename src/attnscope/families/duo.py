"""DuoAttention's trained gates for a decoder LLM (``attnscope analyze duo``): one gate per
key/value head, trained by distillation on synthetic multi-passkey sequences built from the
input file's lines (:mod:`attnscope.analyses.duo`, docs/atlas.md). Writes the gates in
DuoAttention's pattern format (``duo/full_attention_heads.tsv``), which the atlas sweeps as a
ranking (``--atlas-gates``) beside its measured scores, and kvpress's ``DuoAttentionPress`` loads.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from attnscope.analyses.duo import GateTraining, chunks, summarise
from attnscope.analyses.family_result import FamilyResult
from attnscope.data.io import read_text
from attnscope.data.tasks import ORDINALS, haystack_sentences, passkey_training
from attnscope.engines import duo as duo_engine
from attnscope.errors import AttnscopeError
from attnscope.families.base import (
    Context,
    Family,
    Input,
    Prepared,
    hookable_decoder,
    option,
    register_family,
)
from attnscope.report.duo import write_duo
from attnscope.store.results import write_results


@dataclass
class Options:
    duo_steps: int = option(200, "Training steps (one sequence each).", minimum=1)
    duo_passkeys: int = option(5, "Passkeys hidden in each training sequence.", minimum=1)
    duo_words: int = option(8, "Random words per passkey.", minimum=1)
    duo_sink: int = option(4, "First tokens a streaming head keeps (match the atlas's sink).", minimum=0)
    duo_window: int = option(64, "Last tokens a streaming head keeps (match the atlas's window).", minimum=1)
    duo_lr: float = option(0.02, "Peak learning rate of the gates (AdamW).", minimum=0.0)
    duo_reg: float = option(0.05, "Weight of the L1 penalty on the gates.", minimum=0.0)
    duo_chunk: int = option(10, "Steps between two kept states (a killed run resumes there).", minimum=1)


@register_family
class Duo(Family):
    key = "duo"
    title = "DuoAttention's trained gates: which KV heads need their whole cache"
    help = "Train one gate per key/value head of a decoder (DuoAttention) on synthetic passkey data"
    inputs = (Input("duo", "A text file whose lines are the haystack of the training sequences.",
                    sample="text.txt", argument="haystack"),)
    Options = Options
    default_model = "smollm2"
    default_max_seq_len = 1024  # tokens of a training sequence
    order = 74
    demo = False
    causal_only = True
    sample_options = {"duo_steps": 4, "duo_passkeys": 2, "duo_words": 4, "duo_chunk": 2}

    def prepare(self, inputs: dict[str, Any], options: Options, ctx: Context) -> Prepared:
        path = inputs.get("duo")
        if path is None:
            raise AttnscopeError("duo: no file given", params=("duo",))
        lm = ctx.model
        length = min(ctx.max_seq_len, lm.max_positions)  # the training sequences' tokens
        hookable_decoder(lm, "DuoAttention's gates are a decoder's", duo_engine.COMPUTES, length)
        if options.duo_passkeys > len(ORDINALS):
            raise AttnscopeError(f"duo_passkeys must be at most {len(ORDINALS)}, not {options.duo_passkeys}",
                                 params=("duo_passkeys",))
        hay = haystack_sentences(read_text(path))
        if not hay:
            raise AttnscopeError(f"{path}: no text for the haystack (the file has no non-blank line)",
                                 params=("duo",))
        try:
            samples = passkey_training(lm.tokenizer, count=options.duo_steps, length=length,
                                       passkeys=options.duo_passkeys, words=options.duo_words,
                                       haystack=hay, seed=ctx.seed)
        except ValueError as exc:
            raise AttnscopeError(f"{exc}; raise --max-seq-len or lower --duo-passkeys / --duo-words",
                                 params=("max_seq_len",)) from None
        return Prepared({"samples": samples, "source": f"lines of {Path(path).name}", "length": length},
                        weight=options.duo_steps * length // 32 + 1,
                        counts={"steps": options.duo_steps, "tokens_per_step": length})

    def run(self, prepared: Prepared, options: Options, ctx: Context) -> FamilyResult:
        lm = ctx.model
        samples = prepared.data["samples"]
        train = GateTraining(samples, options.duo_steps, options.duo_sink, options.duo_window,
                             lr=options.duo_lr, reg=options.duo_reg)
        records = ctx.units.chain(train, chunks(options.duo_steps, options.duo_chunk), name="training",
                            label="training", unit="chunks")
        snapshots = [np.asarray(r["gates"]) for r in records]
        losses = [row for r in records for row in r["losses"]]
        seconds = float(sum(r["seconds"] for r in records))
        res = summarise(snapshots, losses, seconds=seconds, params=dataclasses.asdict(options), seed=ctx.seed,
                        length=prepared.data["length"], labels=len(samples[0].ids) - samples[0].labels_from,
                        source=prepared.data["source"])
        sec = write_duo(ctx.out_dir, res, model_name=lm.display_name, title=self.title, key=self.key)
        write_results(ctx.out_dir, self.key, res)
        return ctx.result(sec)
