"""An SER root written for the grouping tests of `data personas` and `data rewrite`: per
language two dialogues that open with the same seeker turn (English "Hello", Chinese "你好") and
then go apart, "pet" (a pet died) and "job" (laid off).

Rows per language, in file order (line: dialogue and round):
  1: pet, round 1     2: job, round 1      (the same history: the opener alone)
  3: pet, round 2     4: job, round 2
  5: pet, round 3     6: pet, round 3 again (the same history, other candidate replies)
  7: job, round 3
By the grouping rule: lines 3, 5, 6 are the pet dialogue, lines 4, 7 the job dialogue, and
lines 1-2, a history both go on from, are a group of their own (ambiguous). Each row's Step 1
names its dialogue and line, so a copy can be traced to its row."""
import json
from pathlib import Path

from peer_rl.prompts.judge import PREFERENCE_VERDICTS, STEP_VERDICTS, JudgeTemplate

TURNS = {
    "en": {"pet": ["Hello", "Hi, what's on your mind today?", "My dog Max died on Sunday.",
                   "I'm so sorry about Max.", "The house is so quiet now."],
           "job": ["Hello", "Hello! How are you doing?", "I got laid off a week ago.",
                   "A week ago, that's so recent.", "I haven't told anyone yet."]},
    "zh": {"pet": ["你好", "你好，今天想聊点什么？", "我的狗上周日走了。", "真的很抱歉。",
                   "家里现在好安静。"],
           "job": ["你好", "你好呀，最近怎么样？", "我上周被裁员了。", "才一周，太突然了。",
                   "我还没告诉任何人。"]},
}
ROWS = [("pet", 1), ("job", 1), ("pet", 2), ("job", 2), ("pet", 3), ("pet", 3), ("job", 3)]
STEP1 = {"pet": "The seeker grieves a pet.", "job": "The seeker lost a job."}


def history(lang: str, name: str, rnd: int) -> list[dict]:
    turns = TURNS[lang][name][:2 * rnd - 1]
    return [{"role": "seeker" if i % 2 == 0 else "supporter", "content": t}
            for i, t in enumerate(turns)]


def ser_row(lang: str, line: int, name: str, rnd: int) -> dict:
    steps = [f"{STEP1[name]} (line {line})", "Sentiment: negative.", "Strategy: Question."]
    first, second = f"Reply A to line {line}.", f"Reply B to line {line}."
    verdicts = [STEP_VERDICTS[lang][0], STEP_VERDICTS[lang][1], STEP_VERDICTS[lang][0],
                PREFERENCE_VERDICTS[lang][0]]
    return {"id": (100 if lang == "en" else 200) + line, "lang": lang, "source": "original",
            "messages": JudgeTemplate().conversation(history(lang, name, rnd), steps, first,
                                                     second, verdicts, lang)}


def write_root(root: Path) -> Path:
    for lang in ("en", "zh"):
        path = root / "ser" / lang / "text_train.jsonl"
        path.parent.mkdir(parents=True)
        path.write_text("".join(json.dumps(ser_row(lang, n, name, rnd), ensure_ascii=False)
                                + "\n" for n, (name, rnd) in enumerate(ROWS, start=1)),
                        encoding="utf-8")
    return root


def lines_of(lang: str, group: str) -> set[str]:
    """The row keys (file:line) of a group: "pet", "job" or "shared" (lines 1-2)."""
    lines = {"pet": (3, 5, 6), "job": (4, 7), "shared": (1, 2)}[group]
    return {f"ser/{lang}/text_train.jsonl:{n}" for n in lines}
