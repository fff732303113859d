"""One item's judging as a conversation (judge_rounds): round batching, the chat each round
carries, the verl plug-in's candidate coin. Engine-free: the answers are written here."""
from peer_rl.prompts.judge import JudgeTemplate
from peer_rl.prompts.judge_rounds import JudgeRounds, answer_all, candidate_coin
from peer_rl.protocol import JudgeItem

HISTORY = [{"role": "seeker", "content": "I lost my job today."}]


def item(steps, first=True):
    return JudgeItem(history=HISTORY, lang="en", steps=steps, reply="That must be a shock.",
                     reference="Losing a job hurts.", candidate_first=first,
                     format_complete=all(steps))


def rounds() -> JudgeRounds:
    # no tokenizer: these tests pass the turns, so nothing is fitted to a context
    return JudgeRounds(JudgeTemplate(), tokenizer=None, max_model_len=4096, max_tokens=16)


def test_one_batched_call_per_round_for_the_dialogues_that_ask_it():
    r = rounds()
    items = [item(["a", "b", "c"]), item(["a", None, "c"]), item([None, None, None])]
    calls = []

    def answer(chats):
        calls.append(chats)
        k = len(calls) - 1                    # rounds 0..3 in order, one call each
        return [" True \n" if k < 3 else " The first sentence is better"] * len(chats)

    out = answer_all([r.dialogue(it, r.template.item_turns(it, HISTORY)) for it in items],
                     answer)
    assert [len(c) for c in calls] == [2, 1, 2, 3]   # missing steps are not asked
    assert out[0] == ["True", "True", "True", "The first sentence is better"]
    assert out[1] == ["True", None, "True", "The first sentence is better"]
    assert out[2] == [None, None, None, "The first sentence is better"]
    # item 1's round 3 (Step 3) carries its round-1 answer, stripped, and skips Step 2
    chat = calls[2][1]
    assert [m["role"] for m in chat] == ["system", "user", "assistant", "user"]
    assert chat[2] == {"role": "assistant", "content": "True"}
    assert chat[3] == r.template.step_turn(3, "c", HISTORY, "en")
    # item 2 asks one turn, with the history in it (the outcome layout)
    assert [m["role"] for m in calls[3][2]] == ["system", "user"]
    assert HISTORY[0]["content"] in calls[3][2][1]["content"]


def test_no_items_no_calls():
    assert answer_all([], lambda chats: 1 / 0) == []


def test_candidate_coin_is_stable_seeded_and_balanced():
    assert candidate_coin(0, "uid-1", "reply") == candidate_coin(0, "uid-1", "reply")
    flips = [candidate_coin(0, f"uid-{i}", "same reply") for i in range(2000)]
    assert 900 < sum(flips) < 1100                   # a fair coin: 1000 +- 4.5 sigma
    reseeded = [candidate_coin(1, f"uid-{i}", "same reply") for i in range(2000)]
    assert 900 < sum(a != b for a, b in zip(flips, reseeded)) < 1100   # independent of seed 0
