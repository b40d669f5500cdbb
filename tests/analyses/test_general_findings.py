"""What the general family's statistics say, worked out in analyses (issue 57: reports only lay
out), and stated by the report in the model's own layer numbers."""

from __future__ import annotations

import numpy as np
import pytest

from attnscope.analyses.findings import MOSTLY, general_findings
from attnscope.data.records import layer_numbering
from attnscope.report.general import findings


def _stats():
    L, H = 3, 2
    s = {k: np.zeros((L, H)) for k in ("previous", "next", "first", "separator", "punct", "entropy",
                                        "entropy_first", "sep_to_sep")}
    s["previous"][0, 1] = 0.9
    s["previous"][2, 0] = MOSTLY  # not more than half
    s["next"][1, 1] = np.nan  # (a head with no rows: not counted)
    s["separator"][1] = [0.8, 0.6]  # layer mean 0.7
    s["separator"][2] = [0.4, 0.5]  # 0.45
    s["sep_to_sep"][1, 0] = 0.95
    s["first"][2] = [0.2, 0.4]
    s["punct"][0] = [0.1, 0.3]
    s["entropy"] = np.array([[1.0, 2.0], [3.0, 3.0], [0.5, 0.5]])
    s["entropy_first"][-1] = [1.5, 2.5]
    return s


def test_general_findings_by_hand():
    labels = np.array([["other", "previous"], ["[SEP]", "[SEP]"], ["other", "broad"]])
    f = general_findings(_stats(), labels)
    assert f.mostly == {"previous": [(0, 1)], "next": []}
    np.testing.assert_allclose(f.separator_by_layer, [0.0, 0.7, 0.45])
    assert f.separator_layers == [1] and f.separator_peak == (1, 0.7)
    assert f.separators_to_separators == [(1, 0)]
    assert f.first_peak[0] == 2 and f.first_peak[1] == pytest.approx(0.3)
    assert f.punct_peak[0] == 0 and f.punct_peak[1] == pytest.approx(0.2)
    assert f.entropy_range == (0.5, 3.0) and f.last_first_entropy == 2.0
    assert f.behaviours["[SEP]"] == 2 and f.behaviours["previous"] == 1 and f.behaviours["broad"] == 1
    # Figure 1: previous (0, 1); next: all zero but one NaN -> head (0, 0); first (2, 1);
    # separator (1, 0); entropy's strongest (1, 0) is taken already
    assert [p[:2] for p in f.figure1] == [(0, 1), (0, 0), (2, 1), (1, 0)]


def test_the_report_names_a_hybrids_layers_as_the_model_does():
    # array layers 0, 1, 2 are the model's layers 4, 8, 12 (Mamba between): the peaks were
    # "layer 2" and "layer 3" (array index + 1) before
    f = general_findings(_stats(), np.full((3, 2), "other"))
    with layer_numbering([3, 7, 11]):
        text = " ".join(findings(f, 2.0, "m", 200))
    assert "separator tokens: 8 (the most: layer 8, 70%)" in text
    assert "first special token peaks at layer 12" in text and "commas peaks at layer 4" in text
    assert "(4-2)" in text  # the head with most of its attention on the previous token
