"""The dialogue method's parties (peer_rl.methods.dialogue.Dialogues), against worker groups
that are the test's inputs (they record what they were asked):
- the first message of a seeker that has none (an ESC-Eval role card): once per card, not once
  per dialogue, so a group's dialogues open alike; seeded as the seeker's round 0, apart from
  every later round's seeds;
- the policy party sends only the prompts that leave their reply room, and answers None for
  the others (their dialogues end: `length`)."""
from peer_rl.config.schema import load_config
from peer_rl.methods.base import Groups
from peer_rl.methods.dialogue import Dialogues
from peer_rl.protocol import Sample, request_seed


class Seeker:
    def __init__(self):
        self.asked = []

    def call(self, method, requests, step=None):
        assert method == "chat"
        self.asked.append(requests)
        return [f"Seeker: I need to talk ({len(self.asked)}.{k})" for k in range(len(requests))]


ROWS = [{"id": "card-1", "persona": "You are Ann.", "opening": None, "language": "en"},
        {"id": "sage-1", "persona": "You are Bo.", "opening": "I feel lost.", "language": "en"},
        {"id": "card-2", "persona": "你是小林。", "opening": None, "language": "zh"}]


def test_a_card_gets_one_first_message_for_its_group_seeded_as_round_0():
    cfg = load_config(["recipe=dialogue_tiny", "trainer.seed=5"])
    seeker = Seeker()
    method = Dialogues.from_config(Groups(rollout=None, reward_model=None, seeker=seeker), cfg)
    profiles = method._profiles(ROWS, step=3)
    # two cards asked, in one call; the SAGE profile keeps its own first message
    assert len(seeker.asked) == 1 and len(seeker.asked[0]) == 2
    assert [p.opening for p in profiles] == ["I need to talk (1.0)", "I feel lost.",
                                             "I need to talk (1.1)"]
    first, second = seeker.asked[0]
    assert first.messages[0]["content"] == "You are Ann." and first.schema is None
    assert "first message" in first.messages[-1]["content"]          # asked to open
    assert second.messages[0]["content"] == "你是小林。"
    assert [r.seed for r in seeker.asked[0]] == [request_seed(5, 2, "seeker", k, 1)
                                                 for k in (0, 2)]
    # the dialogues' own seeker rounds never reuse those seeds: 3 rows x G 2 = 6 dialogues
    ask = method._seeker(3, 6)
    ask([([{"role": "system", "content": "x"}], None)] * 6)
    later = {r.seed for r in seeker.asked[1]}
    assert later == {request_seed(5, 2, "seeker", 6 + k, 1) for k in range(6)}
    assert not later & {r.seed for r in seeker.asked[0]}


class Rollout:
    """Counts a prompt's tokens as its number of characters; answers what it was sent."""

    def __init__(self):
        self.asked = []

    def call(self, method, prompts, *args, step=None):
        self.asked.append((method, [p.messages[-1]["content"] for p in prompts]))
        if method == "prompt_tokens":
            return [sum(len(m["content"]) for m in p.messages) for p in prompts]
        return [Sample(uid=p.uid, prompt_ids=[1], response_ids=[2], response_logprobs=[0.0],
                       text=f"answer to {p.messages[-1]['content']}") for p in prompts]


def test_the_policy_party_sends_only_prompts_that_leave_their_reply_room():
    # room = max_model_len - response_length = 100 - 48 = 52 "tokens" (characters here)
    cfg = load_config(["recipe=dialogue_tiny", "rollout.max_model_len=100",
                       "rollout.response_length=48"])
    rollout = Rollout()
    method = Dialogues.from_config(Groups(rollout=rollout, reward_model=None), cfg)
    assert method.dialogue.room == 52
    ask = method._policy(step=1, n_dialogues=3)
    answers = ask([[{"role": "user", "content": "a" * 52}],
                   [{"role": "user", "content": "b" * 53}],
                   [{"role": "user", "content": "c" * 10}]])
    assert [a.text if a else None for a in answers] == [f"answer to {'a' * 52}", None,
                                                         f"answer to {'c' * 10}"]
    assert [(m, [x[0] for x in sent]) for m, sent in rollout.asked] == \
        [("prompt_tokens", ["a", "b", "c"]), ("generate", ["a", "c"])]
