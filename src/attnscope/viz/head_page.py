"""A head's page: what one head does across the corpus, from an output folder's results.

:func:`head_page_payload` turns the results files a run wrote (plain dicts) into what the page
draws: the head's statistics with their 95% intervals and rank among all heads, the labels the
families gave it with the evidence for each, and, per statistic, the examples where the head
scores highest and a few typical ones (``heads/general.json``, kept during the
general family's one pass: :class:`~attnscope.analyses.top_examples.TopExamples`), each with
the query unit and its strongest keys. :mod:`attnscope.views` reads the folder and runs the
model for the full head views the strips open; this module only lays out.
"""

from __future__ import annotations

import math

import numpy as np

from attnscope.analyses.family_result import FamilyResult
from attnscope.analyses.stat import interval95, rank_of, read_records
from attnscope.data.records import HeadId
from attnscope.models.loaded import display_name
from attnscope.models.pieces import running_text, visible

PAYLOAD_VERSION = 1


def _grid(rows: list[dict], key: str, L: int, H: int) -> np.ndarray:
    out = np.full((L, H), np.nan)
    for r in rows:
        v = r.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            out[r["layer"], r["head"]] = float(v)
    return out


def _pct(x: float) -> str:
    return f"{x:.1f}%"


def general_stats(general: FamilyResult, layer: int, head: int) -> list[dict]:
    """The head's general statistics, one per record the results file carries
    (:func:`attnscope.analyses.stat.read_records`): value, 95% interval (mean +- 1.96 standard
    errors of the per-example values, cut at 0 below: no statistic here is negative), rank
    among the heads (as the record ranks) and how many examples."""
    rows = general.tables["general_heads"]
    L, H = 1 + max(r["layer"] for r in rows), 1 + max(r["head"] for r in rows)
    out = []
    for stat in read_records(general.body):
        key = stat["name"]
        grid = _grid(rows, key, L, H)
        v = grid[layer, head]
        if not np.isfinite(v):
            continue
        part = general.analyses.get(stat["analysis"])
        meta = part.meta if part is not None else {}
        se = (meta.get("standard_error") or {}).get(key)
        se = se[layer][head] if se else None
        low, high = interval95(float(v), se, floor=0.0)  # no statistic here is negative
        out.append({"key": key, "what": stat["what"], "value": float(v), "digits": stat["digits"],
                    "low": low, "high": high,
                    "rank": rank_of(grid, layer, head, stat["higher_is_more"]), "of": int(np.isfinite(grid).sum()),
                    "examples": meta.get("examples")})
    return out


def general_labels(general: FamilyResult, name: str, stats: list[dict]) -> list[dict]:
    """Figure 6's behaviour label of the head, with the statistic behind it."""
    row = next((r for r in general.tables["general_heads"] if r["name"] == name), None)
    if row is None or not row.get("behaviour"):
        return []
    by = {s["key"]: s for s in stats}
    basis = {"previous": "previous", "next": "next", "[CLS]": "first", "[SEP]": "separator",
             "punctuation": "punct", "broad": "entropy"}.get(row["behaviour"])
    evidence = "no statistic above the clustering's thresholds"
    if basis in by:
        s = by[basis]
        ci = "" if s["low"] is None else f" [{s['low']:.3f}, {s['high']:.3f}]"
        evidence = f"{s['what']}: {s['value']:.3f}{ci}, rank {s['rank']} of {s['of']} heads"
    return [{"family": "general", "label": f"behaviour: {row['behaviour']}", "evidence": evidence}]


#: a relation seen fewer times is not ranked or labelled on a head page: with n items every head's
#: accuracy is a multiple of 1/n, so with one item each head has 0% or 100% and "rank 1 of 72" says
#: only that it was among the heads that got that one item right
MIN_ITEMS = 10


def syntax_evidence(syntax: FamilyResult, layer: int, head: int, name: str, top: int = 5) -> tuple[list, list]:
    """``(labels, rows)``: the relations this head is Table 1's best head for (accuracy, 95%
    interval, best offset) where it beats the offset baseline, and its ``top`` relations by
    accuracy with their rank among heads; relations with fewer than :data:`MIN_ITEMS` items are
    left out of both."""
    labels = []
    for r in syntax.tables.get("table1", []):
        if r.get("head") == name and r["count"] >= MIN_ITEMS and r["accuracy"] > r["offset_accuracy"]:
            labels.append({"family": "syntax", "label": f"tracks {r['relation']} {r['direction']}",
                           "evidence": f"{_pct(r['accuracy'])} [{r['ci_low']:.1f}, {r['ci_high']:.1f}] "
                                       f"of {r['count']}; best offset {r['offset']}: "
                                       f"{_pct(r['offset_accuracy'])}"})
    acc = syntax.arrays.get("accuracy")  # [R L H 2]
    meta = syntax.meta
    rows = []
    if acc is not None and meta.get("relations"):
        total = syntax.arrays.get("total")
        for r, rel in enumerate(meta["relations"]):
            if total is not None and int(total[r]) < MIN_ITEMS:
                continue
            for d, direction in enumerate(meta["directions"]):
                v = acc[r, layer, head, d]
                if np.isfinite(v):
                    rows.append({"what": f"{rel} {direction}", "value": 100 * float(v),
                                 "rank": rank_of(acc[r, :, :, d], layer, head),
                                 "of": int(np.isfinite(acc[r, :, :, d]).sum()),
                                 "count": None if total is None else int(total[r])})
        rows.sort(key=lambda x: (-x["value"], x["what"]))
        rows = rows[:top]
    return labels, rows


def coref_evidence(coref: FamilyResult, name: str) -> tuple[list, list]:
    """``(labels, rows)``: the head's antecedent accuracy by mention type with its rank among
    heads and the number of mentions scored (types with fewer than :data:`MIN_ITEMS` left out),
    and a label when it is Table 2's best head (with its interval)."""
    heads = coref.tables.get("heads", [])
    meta = coref.meta
    counts = {"all": meta.get("mentions"), **(meta.get("mentions_by_type") or {})}
    mine = next((i for i, r in enumerate(heads) if r["name"] == name), None)
    rows = []
    for key in ("all", "pronoun", "proper", "nominal"):
        vals = np.array([r[key] if isinstance(r.get(key), (int, float)) else np.nan for r in heads], float)
        if mine is None or not np.isfinite(vals[mine]) or (counts.get(key) or 0) < MIN_ITEMS:
            continue
        rows.append({"what": f"antecedent accuracy, {key} mentions", "value": 100 * float(vals[mine]),
                     "rank": rank_of(vals[None], 0, mine),
                     "of": int(np.isfinite(vals).sum()), "count": int(counts[key])})
    labels = []
    for r in coref.tables.get("table2", []):
        if r.get("kind") != "baseline" and r.get("name") == name and r.get("all") is not None:
            lo, hi = r.get("all_lo"), r.get("all_hi")
            ci = "" if lo is None else f" [{100 * lo:.1f}, {100 * hi:.1f}]"
            labels.append({"family": "coref", "label": "coreference head (Table 2)",
                           "evidence": f"{100 * r['all']:.1f}%{ci} of {r.get('all_n')} mentions"})
    return labels, rows


def atlas_labels(atlas: FamilyResult, name: str) -> list[dict]:
    """The atlas's label of this query head with its scores (``tables.heads``), and, where the
    run built the greedy ranking (``tables.greedy``), what keeping the head's KV head did to the
    calibration tasks' needles: the iteration that kept it and the exact-answer accuracy with
    the KV heads kept before it and after it (teacher-forced, every other KV head cut to sink +
    window)."""
    tables = atlas.tables
    heads = tables.get("heads", [])
    row = next((r for r in heads if r.get("name") == name), None)
    if row is None or not row.get("label"):
        return []
    scores = ", ".join(f"{k} {v:.3g}" for k, v in row.items()
                       if isinstance(v, float) and math.isfinite(v) and k not in ("layer", "head"))
    out = [{"family": "atlas", "label": f"atlas: {row['label']}", "evidence": scores}]
    kv_heads = max(r["kv_head"] for r in heads) + 1  # per layer; the greedy ranking counts them all
    kv = f"{row['layer'] + 1}-kv{row['kv_head'] + 1}"
    mine = str(row["layer"] * kv_heads + row["kv_head"])
    greedy = tables.get("greedy") or []
    for i, step in enumerate(greedy):
        if mine in step["added"].split():
            after = (f" -> {greedy[i + 1]['accuracy']:.2f} with it" if i + 1 < len(greedy) else
                     " (the last iteration: its accuracy with it was not kept)")
            out.append({"family": "atlas", "label": f"atlas: KV head {kv} kept by the greedy ranking",
                        "evidence": f"iteration {i + 1}, {step['heads']} KV heads kept before it: calibration "
                                    f"accuracy {step['accuracy']:.2f}{after}"})
            break
    else:
        if greedy:
            out.append({"family": "atlas", "label": f"atlas: KV head {kv} not kept by the greedy ranking",
                        "evidence": f"not among the {sum(len(s['added'].split()) for s in greedy)} KV heads "
                                    f"its {len(greedy)} iterations kept"})
    return out


def unit_labels(units: dict) -> tuple[list[str], list[bool]]:
    """What the page writes for each unit of an example (:func:`~attnscope.analyses.top_examples.units_of`)
    and whether a space comes before it: the pieces of a word run together as the word
    (:func:`~attnscope.models.pieces.running_text`), other whitespace made visible."""
    run = running_text(units["tokens"], units["special"], units.get("text"), units.get("level", "token"))
    return [visible(t) for t, _ in run], [space for _, space in run]


def head_page_payload(results: dict[str, FamilyResult], head_examples: dict | None, name: str, *,
                      folder: str = "", notes: list[str] | None = None) -> dict:
    """Everything the page of head ``name`` (``"5-3"``, 1-indexed as the pages show heads)
    draws, from ``results`` (family key -> that family's results, :class:`FamilyResult`) and ``head_examples``
    (``heads/general.json``, or None). Its ``pages`` (example index -> the file of that
    example's full head view, relative to the page) start empty: whoever writes those files
    (:func:`attnscope.views.write_head_page`) names them there."""
    hid = HeadId.parse(name)
    layer, head = hid.layer, hid.head
    general = results.get("general")
    stats = general_stats(general, layer, head) if general else []
    labels, evidence = (general_labels(general, name, stats) if general else []), []
    if "syntax" in results:
        lab, rows = syntax_evidence(results["syntax"], layer, head, name)
        labels += lab
        if rows:
            evidence.append({"family": "syntax", "title": "Dependency relations (accuracy, %)", "rows": rows})
    if "coref" in results:
        lab, rows = coref_evidence(results["coref"], name)
        labels += lab
        if rows:
            evidence.append({"family": "coref", "title": "Coreference (accuracy, %)", "rows": rows})
    if "atlas" in results:
        labels += atlas_labels(results["atlas"], name)
    model = general.model if general is not None else None
    model_name = display_name(model) if model else None
    examples, units = {}, {}
    if head_examples:
        for stat in (s["key"] for s in stats):
            got = head_examples["heads"].get(stat)
            if got is None:
                continue
            cell = got[layer][head]
            examples[stat] = cell
            for e in cell["top"] + cell["typical"]:
                key = str(e["example"])
                if key not in units:
                    u = head_examples["examples"][key]
                    texts, spaces = unit_labels(u)
                    units[key] = {"labels": texts, "space": spaces, "raw": list(u["tokens"])}
    return {
        "version": PAYLOAD_VERSION,
        "title": f"Head {name}" + (f" of {model_name}" if model_name else "") + (f" ({folder})" if folder else ""),
        "head": name, "layer": layer, "index": head, "model": model_name,
        "stats": stats, "labels": labels, "evidence": evidence,
        "examples": examples, "units": units, "params": (head_examples or {}).get("params"),
        "pages": {},
        "notes": list(notes or []),
    }
