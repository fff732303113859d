"""The data jobs' parsers and selection rules on hand-written answers."""
from peer_rl.datajobs.parse import parse_candidate, parse_filter, parse_persona, parse_rewrite
from peer_rl.datajobs.preference import dominates, perspective_scores, select_pair
from peer_rl.datajobs.rounds import histogram


def test_filter_verdict_from_json_and_from_text():
    keep = parse_filter('{"semantic_incoherence": false, "artificial_style": false, '
                        '"non_dialogue": false, "reason": "a natural exchange"}')
    assert not keep.remove and keep.criteria == [] and keep.reason == "a natural exchange"
    two = parse_filter('{"semantic_incoherence": true, "artificial_style": false, '
                       '"non_dialogue": true, "reason": "(laughs) and a jump"}')
    assert two.remove and two.criteria == ["semantic_incoherence", "non_dialogue"]
    text = parse_filter("Semantic incoherence: yes\nArtificial style: no\n"
                        "Non-dialogue: no\nReason: the reply ignores the question")
    assert text.criteria == ["semantic_incoherence"]
    assert text.reason == "the reply ignores the question"
    zh = parse_filter('{"semantic_incoherence": "否", "artificial_style": "是", '
                      '"non_dialogue": "否", "reason": "模板化"}')
    assert zh.criteria == ["artificial_style"]


def test_a_filter_answer_missing_a_criterion_is_unparsed_not_kept():
    assert parse_filter('{"semantic_incoherence": false, "artificial_style": false}') is None
    assert parse_filter("This dialogue looks fine to me.") is None
    assert parse_filter('{"semantic_incoherence": "maybe", "artificial_style": false, '
                        '"non_dialogue": false}') is None


def test_persona_needs_four_ratings_in_range_and_a_description():
    p = parse_persona('{"dominance": 2, "influence": 5, "steadiness": 3, "compliance": 1, '
                      '"description": "Talks fast, with many exclamation marks."}')
    assert p.disc == {"dominance": 2, "influence": 5, "steadiness": 3, "compliance": 1}
    assert p.description == "Talks fast, with many exclamation marks."
    assert parse_persona('{"dominance": 6, "influence": 5, "steadiness": 3, "compliance": 1, '
                         '"description": "x"}') is None
    assert parse_persona('{"dominance": 2, "influence": 5, "steadiness": 3, "compliance": 1, '
                         '"description": " "}') is None
    text = parse_persona("Dominance: 4\nInfluence: 1\nSteadiness: 2\nCompliance: 5\n"
                         "Description: precise and terse")
    assert text.disc["compliance"] == 5 and text.description == "precise and terse"


def test_rewrite_needs_exactly_the_seekers_number_of_messages():
    assert parse_rewrite('{"turns": ["a", "b"]}', 2) == ["a", "b"]
    assert parse_rewrite('{"turns": ["a", "b", "c"]}', 2) is None
    assert parse_rewrite('{"turns": ["a", ""]}', 2) is None
    assert parse_rewrite("1. first one\n2) second one", 2) == ["first one", "second one"]


def test_candidate_needs_a_reply():
    c = parse_candidate('{"context": "loss", "state": "sad, intense", "strategy": "reflection", '
                        '"reply": "That sounds so heavy."}')
    assert c == {"context": "loss", "state": "sad, intense", "strategy": "reflection",
                 "reply": "That sounds so heavy."}
    assert parse_candidate('{"context": "x", "reply": "  "}') is None
    assert parse_candidate("I would say: that sounds heavy.") is None


def _s(c, o, j):
    return {"client": c, "counselor": o, "judge": j}


def test_dominance_selection_worked_by_hand():
    assert dominates(_s(8, 7, 7), _s(8, 6, 7)) and not dominates(_s(8, 7, 7), _s(8, 7, 7))
    assert not dominates(_s(9, 5, 7), _s(8, 6, 7))            # better on one, worse on another
    # 0: total 22 (front), 1: 21 dominated by 0, 2: 15 dominated by 0 and 3, 3: 23 (front)
    scores = [_s(8, 7, 7), _s(8, 6, 7), _s(5, 5, 5), _s(9, 9, 5)]
    assert select_pair(scores, min_margin=1.0) == (3, 2)       # 3 dominates only 2
    # the margin: 0 over 1 is 1.0 -> a pair at 1.0, none at 1.5
    assert select_pair([_s(8, 7, 7), _s(8, 6, 7)], 1.0) == (0, 1)
    assert select_pair([_s(8, 7, 7), _s(8, 6, 7)], 1.5) == (0, None)
    # unparsed candidates take no part; nobody dominated -> no pair
    assert select_pair([None, _s(9, 5, 7), _s(5, 9, 7)], 0.0) == (1, None)


def test_perspective_scores_are_the_means_of_their_dimensions():
    client = '{"emotional_impact": 6, "non_lecturing_empathy": 9, "therapeutic_alliance": 9}'
    counselor = '{"strategic_coherence": 4, "theoretical_application": 7}'
    judge = '{"strategy_client_fit": 10, "problem_targeting": 9}'
    assert perspective_scores([client, counselor, judge]) == {"client": 8.0, "counselor": 5.5,
                                                              "judge": 9.5}
    assert perspective_scores([client, '{"strategic_coherence": 4}', judge]) is None


def test_round_histogram_by_relative_position():
    h = histogram([(1, 10), (5, 10), (6, 10), (10, 10), (2, 4)])
    # (r - 0.5) / N: 0.05, 0.45, 0.55, 0.95, 0.375 -> bins 0, 4, 5, 9, 3
    assert h["relative_position_histogram"] == [1, 0, 0, 1, 1, 1, 0, 0, 0, 1]
    assert h["round_histogram"] == {1: 1, 2: 1, 5: 1, 6: 1, 10: 1}
    assert abs(h["mean_relative_position"] - (0.05 + 0.45 + 0.55 + 0.95 + 0.375) / 5) < 1e-12


def test_stage_notes_picks_and_replies():
    from peer_rl.datajobs.parse import parse_note, parse_pick, parse_reply

    assert parse_note('{"note": " job loss, exploration "}') == "job loss, exploration"
    assert parse_note('{"note": ""}') is None and parse_note("a note") is None
    assert parse_reply('<think>x</think>{"reply": "That sounds hard."}') == "That sounds hard."
    assert parse_pick('{"best": 2}', 3) == 1 and parse_pick('{"best": "3"}', 3) == 2
    for bad in ('{"best": 0}', '{"best": 4}', '{"best": true}', '{"best": "two"}', "2"):
        assert parse_pick(bad, 3) is None, bad
