"""ESC-Preference in peer-rl's layout: preference pairs for the scalar reward model and the
exemplar corpus the ESCRAG-R1 index is built from.

    preference/*.jsonl  {"id", "language", "history", "chosen", "rejected",
                         "scores"?: {"chosen": {"client", "counselor", "judge"},
                                     "rejected": {...}}, "source"?}
    exemplars/*.jsonl   {"id", "language", "history", "response", "dialogue"?, "strategy"?,
                         "source"?}; `dialogue` names the conversation the exemplar comes from
    cold_start/*.jsonl  {"id", "language", "messages": [system, user, assistant], "pass"?,
                         "source"?}: demonstrations of the reasoning-response format for the
                         cold-start SFT; the assistant turn is `<think>reasoning</think>reply`
                         and the prompt is the policy's pass-1 or pass-2 prompt
                         (peer_rl.prompts.escrag); `pass` is "initial" or "refined"
                         ("final", its old spelling, still reads as "refined")

`history` takes every spelling the PEER subsets accept (peer_rl.data.vocab) and ends with the
seeker turn that `chosen` / `rejected` / `response` answer; scores are the Client, Counselor and
Judge perspectives' 0-10 ratings where the data has them (the reward model trains on the pair
alone). The bundled sample derives both from the project's own dialogues: a pair per supporter
turn and quality level (the reply vs the worse reply, the equally good alternative vs the
unusable one), the train turns' equally good alternatives as exemplars (never a GRPO
reference reply), and one cold-start
demonstration per train turn and pass (reasoning from the turn's stage / state / strategy
annotations; the pass-2 one revises the worse reply with the alternative and two replies of the
same strategy from other dialogues as its guidelines).
"""
from __future__ import annotations

from collections.abc import Callable

from peer_rl.prompts.escrag import format_reasoned, initial_messages, refined_messages

PERSPECTIVES = ("client", "counselor", "judge")
PASSES = ("initial", "refined")      # pass 1, pass 2 (the reply written with the exemplars)
# one word per idea (issue 59): pass 2's `pass` value was "final"; files written before read
# as "refined"
OLD_PASSES = {"final": "refined"}
# the bundled sample still writes pass 2 under its old spelling (`"pass": "final"`, ids ending
# `-final`), read as "refined": the tiny models' tokenizer is trained on every string of the
# sample (peer_rl.supervised.tiny_models.default_corpus), so new bytes there change the tiny
# start models and call for rebuilding the shipped tiny models (`peer-rl models build-tiny`) and
# the SmolLM2 adapters' data digest (`build-smollm2`)
SAMPLE_PASS_2 = "final"

_REVISE = {"en": "The guidelines fit better than my draft.", "zh": "参考回复比初稿更贴切。"}


def canonical_pass(value) -> str | None:
    """A cold-start row's `pass` under today's name (PASSES); None for any other value."""
    value = OLD_PASSES.get(value, value) if isinstance(value, str) else None
    return value if value in PASSES else None


def preference_rows(targets: list[dict], split: str) -> list[dict]:
    rows = []
    for t in (t for t in targets if t["split"] == split):
        base = {"language": t["lang"], "history": t["history"], "source": "peer-rl sample"}
        rows.append({"id": f"{t['id']}-a", **base, "chosen": t["text"], "rejected": t["poor"]})
        rows.append({"id": f"{t['id']}-b", **base, "chosen": t["alt_good"],
                     "rejected": t["unusable"]})
    return rows


def exemplar_rows(targets: list[dict]) -> list[dict]:
    """The equally good alternatives of the train turns: preferred replies (the chosen side of
    the `-b` pairs) that are never a GRPO prompt's reference (`solution`), so a policy cannot
    be handed the reply it is scored against. Test dialogues give none."""
    return [{"id": f"{t['id']}-alt", "dialogue": t["dialogue"], "language": t["lang"],
             "history": t["history"], "strategy": t["strategy"], "source": "peer-rl sample",
             "response": t["alt_good"]}
            for t in targets if t["split"] == "train"]


def cold_start_rows(targets: list[dict], reasoning: Callable[[dict], str]) -> list[dict]:
    """Pass-1 and pass-2 demonstrations for the train targets (`reasoning(target)`: its three
    counselling stages as prose)."""
    train = [t for t in targets if t["split"] == "train"]
    rows = []
    for t in train:
        lang, why = t["lang"], reasoning(t)
        base = {"language": lang, "source": "peer-rl sample"}
        rows.append({"id": f"{t['id']}-initial", **base, "pass": "initial",
                     "messages": initial_messages(t["history"], lang)
                     + [{"role": "assistant", "content": format_reasoned(why, t["text"])}]})
        same = [o["text"] for o in train if o["strategy"] == t["strategy"]
                and o["lang"] == lang and o["dialogue"] != t["dialogue"]]
        guidelines = [t["alt_good"]] + same[:2]
        rows.append({"id": f"{t['id']}-{SAMPLE_PASS_2}", **base, "pass": SAMPLE_PASS_2,
                     "messages": refined_messages(t["history"], lang, t["poor"], guidelines)
                     + [{"role": "assistant", "content": format_reasoned(
                         why + (" " if lang == "en" else "") + _REVISE[lang], t["text"])}]})
    return rows
