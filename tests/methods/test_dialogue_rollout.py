"""Whole conversations (peer_rl.methods.dialogue_rollout) driven by scripted parties: who sees
what, when a dialogue ends, and that the parties are asked in lock-step. The parties are the
test's inputs; the turn-taking, the prompts and the emotion are the code's."""
import json

import pytest

from peer_rl.algos.emotion import EmotionRules
from peer_rl.methods.dialogue_rollout import (DialogueTooLong, SeekerProfile, dialogue,
                                              run_dialogues)
from peer_rl.prompts.policy import PolicyTemplate
from peer_rl.protocol import Sample

SECRET = "HIDDEN-REASONING"


def profile(i: int) -> SeekerProfile:
    return SeekerProfile(id=f"p{i}", persona=f"You are seeker {i}.",
                         opening=f"I feel lost ({i}).", language="en")


class Script:
    """The policy answers Steps 1-3 holding SECRET, then "Reply <dialogue>.<turn>"; the
    analyser answers the next change of `changes[dialogue]`; the seeker says goodbye where
    `goodbye[dialogue]` is its turn. Every request is kept."""

    def __init__(self, changes, goodbye=None):
        self.changes, self.goodbye = changes, goodbye or {}
        self.calls = {"policy": [], "seeker": []}
        self.turn = {}

    def dialogue_of(self, messages) -> int:
        text = " ".join(m["content"] for m in messages)
        return next(i for i in range(len(self.changes)) if f"({i})" in text
                    or f"seeker {i}." in text)

    def policy(self, requests):
        self.calls["policy"].append(requests)
        out = []
        for messages in requests:
            d = self.dialogue_of(messages)
            t = self.turn[d] = self.turn.get(d, 0) + 1
            text = (f"Step 1: {SECRET} history\nStep 2: {SECRET} emotion\n"
                    f"Step 3: {SECRET} strategy\nStep 4: Reply {d}.{t}")
            out.append(Sample(uid=d, prompt_ids=[1], response_ids=[2], response_logprobs=[-1.0],
                              text=text))
        return out

    def seeker(self, requests):
        self.calls["seeker"].append(requests)
        out = []
        for messages, schema in requests:
            d = self.dialogue_of(messages)
            t = self.turn[d]
            if schema is not None:
                change = self.changes[d][t - 1]
                out.append(change if isinstance(change, str) else
                           json.dumps({"change": change, "reaction": f"felt {change}"}))
            else:
                out.append("Thanks, goodbye!" if self.goodbye.get(d) == t else f"Seeker: more {d}.{t}")
        return out


def run(script, n, max_turns=3, rules=EmotionRules()):
    programs = [dialogue(i, profile(i), PolicyTemplate(), max_turns, rules) for i in range(n)]
    return run_dialogues(programs, {"policy": script.policy, "seeker": script.seeker})


def test_the_seeker_reads_each_reply_and_never_the_reasoning():
    script = Script([[2, 3, 1]])
    (d,) = run(script, 1)
    seeker_texts = [m["content"] for call in script.calls["seeker"] for messages, _ in call
                    for m in messages]
    assert not any(SECRET in t for t in seeker_texts)
    assert any("Reply 0.1" in t for t in seeker_texts) and any("Reply 0.3" in t for t in seeker_texts)
    # the policy's own later prompts hold its earlier replies as the seeker read them
    third = script.calls["policy"][2][0][1]["content"]
    assert "Reply 0.1" in third and "Reply 0.2" in third and SECRET not in third
    assert "more 0.1" in third and "more 0.2" in third      # the seeker's lines, cleaned
    assert [t.history[-1]["content"] for t in d.turns] == ["I feel lost (0).", "more 0.1",
                                                           "more 0.2"]


def test_the_emotion_follows_the_stated_changes_and_ends_the_dialogue():
    script = Script([[10, 10, 10], [-10, -10, -10], [4, "no idea", 4]])
    high, low, plain = run(script, 3, rules=EmotionRules(start=40, low=25, high=60))
    assert high.trajectory == [40, 50, 60] and high.end == "success" and len(high.turns) == 2
    assert high.turns[-1].seeker is None          # no reply asked after the last analysis
    assert low.trajectory == [40, 30, 20] and low.end == "failure"
    assert plain.trajectory == [40, 44, 44, 48] and plain.end == "max_turns"
    assert [t.change for t in plain.turns] == [4, None, 4]     # unparseable: counted as 0


def test_dialogues_that_end_early_free_their_place_and_parties_are_asked_once_a_round():
    script = Script([[1, 1, 1]] * 3, goodbye={1: 1, 2: 2})
    dialogues = run(script, 3)
    assert [d.end for d in dialogues] == ["max_turns", "goodbye", "goodbye"]
    assert [len(d.turns) for d in dialogues] == [3, 1, 2]
    assert [len(c) for c in script.calls["policy"]] == [3, 2, 1]
    # each turn: the analyser for every live dialogue, then the replies
    assert [len(c) for c in script.calls["seeker"]] == [3, 3, 2, 2, 1, 1]
    assert [d.uid for d in dialogues] == [0, 1, 2]


def test_a_dialogue_whose_next_prompt_has_no_room_ends_there_trained_as_far_as_it_got():
    script = Script([[1, 1, 1]])
    answered = []

    def policy(requests):             # the second turn's prompt does not fit
        answered.append(len(requests))
        return script.policy(requests) if len(answered) == 1 else [None] * len(requests)

    (d,) = run_dialogues([dialogue(0, profile(0), PolicyTemplate(), max_turns=3)],
                         {"policy": policy, "seeker": script.seeker})
    assert d.end == "length" and len(d.turns) == 1 and d.trajectory == [40, 41]
    assert d.turns[0].seeker == "more 0.1"            # it had spoken before the end


def test_a_first_prompt_without_room_names_the_seeker():
    with pytest.raises(DialogueTooLong, match=r"seeker 'p0': the policy's first prompt leaves "
                                              r"no room"):
        run_dialogues([dialogue(0, profile(0), PolicyTemplate(), max_turns=3)],
                      {"policy": lambda requests: [None] * len(requests),
                       "seeker": Script([[1]]).seeker})
