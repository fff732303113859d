"""`eval diversity`'s judge items show the judge the whole dialogue the policy was prompted
with, as training does by default (data.max_history_turns=0)."""
from peer_rl.evaluation.diversity import judge_items

TURNS = [{"role": "seeker" if i % 2 == 0 else "supporter", "content": f"turn {i}"}
         for i in range(11)]


def test_the_judge_reads_every_turn_of_the_prompt():
    record = {"id": "c1", "language": "en", "history_turns": TURNS, "solution": "ref",
              "model_raw": ["Step 1: a.\nStep 2: b.\nStep 3: c.\nStep 4: I hear you."] * 2}
    items = judge_items([record], seed=0)
    assert len(items) == 2
    assert all([t["content"] for t in it.history] == [f"turn {i}" for i in range(11)]
               for it in items)
