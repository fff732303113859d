"""PEER's judge metrics from hand-built judge results (peer_rl.methods.peer.judge_metrics)."""
from types import SimpleNamespace

import pytest

from peer_rl.methods.peer import judge_metrics
from peer_rl.protocol import JudgeResult


def _result(steps, preference_ok, failures, asked):
    return JudgeResult(step_verdicts=steps, preference=None, preference_ok=preference_ok,
                       reward=0.0, parse_failures=failures, asked=asked)


def test_parse_failure_and_inconsistency_rates_are_the_hand_counts():
    """Six samples as the judge could answer them (None: not asked, or asked and unparsed):
    0 all steps sound, reply as good as the reference: consistent;
    1 all steps sound, reply worse: inconsistent;
    2 no step sound (False, unparsed, False), reply as good: inconsistent; 1 failure of 4;
    3 one step sound, step 3 missing (not asked), preference unparsed: consistent; 1 of 3;
    4 nothing parses: no step sound and no preference, so no contradiction; 4 of 4;
    5 two steps of three sound, reply as good: consistent (only all or none can contradict).
    Inconsistent: 2 of 6; unparsed: 0 + 0 + 1 + 1 + 4 + 0 = 6 of 4 + 4 + 4 + 3 + 4 + 4 = 23
    asked."""
    results = [_result([True, True, True], True, 0, 4),
               _result([True, True, True], False, 0, 4),
               _result([False, None, False], True, 1, 4),
               _result([True, False, None], None, 1, 3),
               _result([None, None, None], None, 4, 4),
               _result([True, False, True], True, 0, 4)]
    parsed = [SimpleNamespace(complete=c) for c in (True, True, False, False, True, True)]
    m = judge_metrics(parsed, results)
    assert m["judge/inconsistency_rate"] == pytest.approx(2 / 6)
    assert m["judge/parse_failure_rate"] == pytest.approx(6 / 23)
    assert m["judge/asked"] == 23
    # steps called sound: step 1 in samples 0, 1, 3, 5; step 2 in 0, 1; step 3 in 0, 1, 5
    assert (m["reward/step1_true_rate"], m["reward/step2_true_rate"],
            m["reward/step3_true_rate"]) == pytest.approx((4 / 6, 2 / 6, 3 / 6))
    assert m["reward/preference_ok_rate"] == pytest.approx(3 / 6)     # samples 0, 2, 5
    assert m["reward/format_rate"] == pytest.approx(4 / 6)
