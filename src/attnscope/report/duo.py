"""DuoAttention's trained gates, written: the gates in DuoAttention's pattern format
(``duo/full_attention_heads.tsv`` and ``duo/config.json``, what the atlas's ``--atlas-gates``
and kvpress's ``DuoAttentionPress`` read), the gates and the training's losses as tables, and
two figures (the gates per layer and KV head, the losses per step)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from attnscope.analyses.base import Result
from attnscope.analyses.duo import HELD
from attnscope.data.io import atomic_write_text
from attnscope.report.figures import new_figure, save_figure
from attnscope.report.section import FigureArtifact, Section, TableArtifact
from attnscope.report.tables import write_table


def write_tsv(path: Path, values: np.ndarray, digits: int = 6) -> Path:
    """``values`` ``[L Hkv]`` as DuoAttention's pattern files hold them: one line per layer, one
    tab-separated value per KV head."""
    atomic_write_text(path, "\n".join("\t".join(f"{x:.{digits}f}" for x in row) for row in values) + "\n")
    return path


def write_pattern(folder: Path, gates: np.ndarray, *, sink: int, window: int, extra: dict,
                  digits: int = 6) -> list[Path]:
    """``full_attention_heads.tsv`` (:func:`write_tsv` of ``gates``) and ``config.json``
    (``sink_size``, ``recent_size`` and ``extra``) in ``folder``: DuoAttention's pattern format."""
    folder.mkdir(parents=True, exist_ok=True)
    cfg = folder / "config.json"
    atomic_write_text(cfg, json.dumps({"sink_size": sink, "recent_size": window, **extra}, indent=2) + "\n")
    return [write_tsv(folder / "full_attention_heads.tsv", gates, digits), cfg]


def write_duo(out_dir: Path, res: Result, *, model_name: str, title: str, key: str) -> Section:
    out_dir = Path(out_dir)
    tables_dir, fig_dir = out_dir / "tables", out_dir / "figures"
    tables_dir.mkdir(parents=True, exist_ok=True)
    fig_dir.mkdir(parents=True, exist_ok=True)
    gates, p, m = res.arrays["gates"], res.params, res.meta
    write_pattern(out_dir / "duo", gates, sink=p["duo_sink"], window=p["duo_window"],
                  extra={"model": model_name, "steps": p["duo_steps"], "lr": p["duo_lr"], "reg_weight": p["duo_reg"],
                         "tokens_per_step": p["tokens_per_step"], "seed": p["seed"],
                         "held": f"{HELD}: each gate's mean over the training's chunks, the tie-break of equal gates"})
    write_tsv(out_dir / "duo" / HELD, res.arrays["held"])
    sec = Section(key=key, title=title)
    losses = res.tables["training"]
    last = losses[-1]
    sec.findings = [
        f"{m['steps']} steps of {p['tokens_per_step']} tokens ({p['duo_passkeys']} passkeys of {p['duo_words']} "
        f"words, {p['label_tokens']} answer tokens distilled each).",
        f"{m['open']} of {m['kv_heads']} KV heads end with a gate >= 0.5 (they keep their whole cache); "
        f"the last step's distillation loss is {last['distill']:.4g}, its L1 sum of the gates {last['reg']:.4g}.",
    ]
    cols = ["layer", "kv_head", "gate", "held", "rank"]
    sec.tables.append(TableArtifact("duo_gates", "Each KV head's trained gate (1: whole cache), its mean over the "
                                                 "training's chunks (held: the tie-break of equal gates) and its rank.",
                                    res.tables["gates"], cols,
                                    write_table(res.tables["gates"], tables_dir / "duo_gates", columns=cols)))
    lcols = ["step", "distill", "reg", "loss", "lr"]
    sec.tables.append(TableArtifact("duo_training", "Losses per step: distillation (mean squared difference "
                                                    "of the last hidden states), the gates' L1 sum, total, "
                                                    "learning rate.", losses, lcols,
                                    write_table(losses, tables_dir / "duo_training", columns=lcols)))
    fig, (a, b) = new_figure(ncols=2, figsize=(9, max(3.0, 0.15 * gates.shape[0] + 1)))
    im = a.imshow(gates, vmin=0, vmax=1, cmap="viridis", aspect="auto", interpolation="nearest")
    a.set_xticks(range(gates.shape[1]), [str(k) for k in range(gates.shape[1])])
    a.set_xlabel("KV head (0-indexed)")
    a.set_ylabel("layer (0-indexed)")
    a.set_title(f"{model_name}: gates", fontsize=9)
    fig.colorbar(im, ax=a)
    b.plot([r["step"] for r in losses], [r["distill"] for r in losses], lw=1)
    b.set_xlabel("step")
    b.set_ylabel("distillation loss")
    b.set_title("training", fontsize=9)
    sec.figures.append(FigureArtifact("duo_gates", "The trained gates and the distillation loss per step.",
                                      save_figure(fig, fig_dir / "duo_gates")))
    sec.methods.append(
        "DuoAttention (Xiao et al. 2024): each KV head's attention is a * full + (1 - a) * (sink + window); "
        "the gates a are trained by distilling the last hidden states of the answer tokens of multi-passkey "
        "sequences with an L1 penalty (docs/atlas.md). duo/full_attention_heads.tsv is DuoAttention's pattern "
        "format: attnscope analyze atlas --atlas-gates reads it.")
    res.summary = list(sec.findings)
    sec.methods.append(f"Cost: the training took {m['seconds'] / 60:.1f} min ({m['seconds_per_step']:.1f} s a step) "
                       "on this machine (results meta: seconds).")
    return sec
