"""The headline averages of ESC-Eval and the Client-Counselor-Judge evaluation, worked by hand:
CCJ's is the mean of the three perspectives (ESCRAG-R1 averages across Client, Counselor and
Judge), with the seven dimensions' mean beside it; both protocols average only the cases whose
every dimension parsed and name the others."""
import pytest

from peer_rl.evaluation.ccj import summarise_ccj
from peer_rl.evaluation.esc import summarise_esc
from peer_rl.evaluation.prompts import CCJ_DIMENSIONS, DIMENSIONS
from peer_rl.evaluation.report import write_report

# Client: emotional impact, non-lecturing empathy, therapeutic alliance; Counselor: strategic
# coherence, theoretical application; Judge: strategy-client fit, problem targeting
SCORES = [9, 9, 10, 8, 8, 9, 8]


def _ccj(i, scores):
    return {"id": str(i), "language": "en", "format_ok": True,
            "scores": dict(zip(CCJ_DIMENSIONS, scores))}


def test_ccj_headline_is_the_mean_of_the_three_perspectives():
    s = summarise_ccj([_ccj(1, SCORES)])
    # perspectives: Client (9 + 9 + 10) / 3 = 28/3 = 9.333, Counselor (8 + 8) / 2 = 8,
    # Judge (9 + 8) / 2 = 8.5
    assert s["perspectives"] == pytest.approx({"client": 28 / 3, "counselor": 8.0,
                                               "judge": 8.5})
    # the paper's average across perspectives: (28/3 + 8 + 8.5) / 3 = 77.5 / 9 = 8.611
    assert s["average"] == pytest.approx(77.5 / 9) and round(s["average"], 3) == 8.611
    # the seven dimensions weighed alike: 61 / 7 = 8.714 (Client's three weigh 3/7, not 1/3)
    assert s["dimension_average"] == pytest.approx(61 / 7)
    assert round(s["dimension_average"], 3) == 8.714


def test_ccj_averages_leave_out_a_context_with_a_missing_dimension():
    # context 2's Counselor answer gave no theoretical application
    s = summarise_ccj([_ccj(1, SCORES), _ccj(2, [1, 1, 1, 1, None, 1, 1])])
    # averages over context 1 alone: the figures of the test above
    assert s["average"] == pytest.approx(77.5 / 9)
    assert s["dimension_average"] == pytest.approx(61 / 7)
    assert s["complete"] == 1 and s["incomplete_ids"] == ["2"]
    assert s["missing"] == {"theoretical_application": 1}
    # each dimension's own mean still uses every score that parsed: (9 + 1) / 2 = 5
    assert s["dimensions"]["emotional_impact"] == {"mean": 5.0, "n": 2, "unparsed": 0}
    assert s["dimensions"]["theoretical_application"] == {"mean": 8.0, "n": 1, "unparsed": 1}


def test_esc_average_covers_only_dialogues_with_every_score():
    recs = [{"id": "a", "language": "en", "turns": [{"format_ok": True}],
             "scores": {d: 4 for d in DIMENSIONS}},
            {"id": "b", "language": "en", "turns": [{"format_ok": True}],
             "scores": {**{d: 2 for d in DIMENSIONS}, "fluency": None}}]
    s = summarise_esc(recs)
    # averaging the dimension means would give (4 + 6 x 3) / 7 = 22/7 = 3.14: fluency over
    # dialogue a alone, the six others over a and b. Over the complete dialogue a: 28 / 7 = 4
    assert s["average"] == pytest.approx(4.0) and s["average_scaled"] == pytest.approx(100.0)
    assert s["complete"] == 1 and s["incomplete_ids"] == ["b"] and s["missing"] == {"fluency": 1}
    # a dimension that parsed in no dialogue: no complete dialogue, no average
    recs[0]["scores"]["overall"] = None
    s = summarise_esc(recs)
    assert s["average"] is None and s["average_scaled"] is None and s["complete"] == 0
    assert s["missing"] == {"fluency": 1, "overall": 1}


def test_the_reports_say_what_the_averages_cover_and_how_they_compare(tmp_path):
    manifest = {"parties": {"model": {"path": "/m", "prompt": "escrag"}}}
    s = summarise_ccj([_ccj(1, SCORES), _ccj(2, [1, 1, 1, 1, None, 1, 1])])
    s |= {"skipped_inputs": [], "left_out_languages": {}}
    (tmp_path / "ccj").mkdir()
    write_report(tmp_path / "ccj", s, manifest)
    md = (tmp_path / "ccj" / "report.md").read_text()
    assert "| Average (perspectives) | 7-dimension mean | contexts |" in md
    assert "| 8.61 | 8.71 | 2 |" in md
    assert ("- averages over 1 of 2 cases (those with every dimension parsed); left out: 2; "
            "missing: theoretical_application 1") in md
    assert "compare models scored by the same judge" in md
    esc = summarise_esc([{"id": "a", "language": "en", "turns": [{"format_ok": True}],
                          "scores": {d: 3 for d in DIMENSIONS}}])
    (tmp_path / "esc").mkdir()
    write_report(tmp_path / "esc", esc, manifest)
    md = (tmp_path / "esc" / "report.md").read_text()
    assert "compare models scored by the same judge, not with the PEER paper's figures" in md
    assert "- averages over 1 of 1 cases (those with every dimension parsed)" in md
