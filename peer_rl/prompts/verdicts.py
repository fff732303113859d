"""The judge's verdicts read from its answers: a step's True/False and the 4-way preference
between the candidate and the reference reply, in English and Chinese (the reading rules are
peer_rl.prompts.verdict_text's)."""
from __future__ import annotations

import enum

from peer_rl.prompts.verdict_text import Label, read_label


class Preference(enum.IntEnum):
    FIRST = 0     # "The first sentence is better"      / 第一句更好
    SECOND = 1    # "The second sentence is better"     / 第二句更好
    TIE = 2       # "The two sentences are almost good" / 差不多
    NEITHER = 3   # "Neither sentence is available"     / 都不可用


# What a judge's answer may say (read by peer_rl.prompts.verdict_text: negations flip True/False,
# hedges, contradictions and the quoted options are parse failures)
STEP_LABELS = (
    Label(True, (r"\btrue\b", r"\bcorrect\b", "正确", "对的", "没错", "无误", r"(?<!\w)对(?!\w)"),
          opposite=False),
    Label(False, (r"\bfalse\b", r"\bincorrect\b", r"\bwrong\b", r"\buntrue\b", "错误", "错的",
                  "不对", r"(?<!\w)错(?!\w)",
                  # 没有错 / 没什么错 / 并没有任何错: the negation is part of the phrase
                  r"(?P<gap>并?没有?)(?:什么|任何|啥)?错(?!\w)"), opposite=True),
)


_COMPARATIVES = r"better|worse|superior|inferior"


def _ordinal(en: str, zh: str, other_en: str, other_zh: str) -> tuple[str, ...]:
    """The ways of saying the `en`/`zh` reply is preferred, each one reply named and judged: it
    is better ("the first ... better (than the second)", "第一句 ... 更好", "第一句比第二句更好",
    "第一句优于第二句"), or the other is worse ("the second ... worse", "the second is not as
    good as the first", "第二句比第一句差", "第二句不如第一句", "第二句没有第一句好"). The
    words between the reply and the comparative (`gap`) name neither the other reply nor a
    second comparative, so a negation there ("is not better", "is no better", 并不比) counts."""
    gap_en = rf"(?P<gap>(?:(?!\b(?:{other_en}|{_COMPARATIVES})\b)[^,:，：])*?)"
    gap_en_other = rf"(?P<gap>(?:(?!\b(?:{en}|{_COMPARATIVES})\b)[^,:，：])*?)"
    one, other = rf"{zh}(?:句|条|个)?(?:回复|回答|句子)?", rf"{other_zh}(?:句|条|个)?(?:回复|回答|句子)?"
    gap_zh = rf"(?P<gap>(?:(?!{other_zh}|更好|更差)[^,:，：])*?)"
    gap_zh_other = rf"(?P<gap>(?:(?!{zh}|更好|更差)[^,:，：])*?)"
    degree = r"(?:要|还|更加|更|稍微|稍|略|明显)*"
    return (
        rf"\b(?:the\s+)?{en}\b{gap_en}\b(?:better|superior)\b",
        rf"\b(?:the\s+)?{other_en}\b{gap_en_other}\b(?:worse|inferior)\b",
        rf"\b(?:the\s+)?{other_en}\b{gap_en_other}(?:\bnot|n't)\s+(?:quite\s+)?(?:as|so)\s+good"
        rf"\s+as\b",
        rf"{one}{gap_zh}更好",
        rf"{one}{gap_zh}比(?:起)?{other}{degree}(?:好|出色|优秀|合适|恰当)",
        rf"{one}{gap_zh}(?:优于|好于|胜过|强于){other_zh}",
        rf"{other}{gap_zh_other}(?:更|较|比较)差(?!不多)",
        rf"{other}{gap_zh_other}比(?:起)?{one}{degree}(?:差|糟|逊色|弱)",
        rf"{other}{gap_zh_other}(?:不如|比不上|逊于|逊色于|劣于|差于){zh}",
        rf"{other}{gap_zh_other}没有{one}(?:那么|这么)?(?:好|出色|优秀|合适|恰当)",
    )


PREFERENCE_LABELS = (
    Label(Preference.FIRST, _ordinal("first", "第一", "second", "第二")),
    Label(Preference.SECOND, _ordinal("second", "第二", "first", "第一")),
    Label(Preference.TIE, (r"\b(?:the\s+two\s+(?:sentences|replies)\s+are\s+)?(?:almost|about|"
                           r"equally)\s+(?:equally\s+)?good\b", "差不多", "相差无几", "不相上下")),
    Label(Preference.NEITHER, (r"\bneither\b(?P<gap>[^,:，：]*?)\bavailable\b", "都不可用",
                               "均不可用")),
)


def parse_step_verdict(text: str) -> bool | None:
    """True / False (zh 正确 / 错误) as a person reads the answer: "not true" is False, "probably
    true" or "True. No, false." is None (verdict_text's table)."""
    return read_label(text, STEP_LABELS)


def parse_preference(text: str) -> Preference | None:
    """The 4-way preference verdict; "the first sentence is not better" alone, a hedge or two
    different preferences -> None."""
    return read_label(text, PREFERENCE_LABELS)


def candidate_preference_ok(verdict: Preference | None, candidate_first: bool) -> bool | None:
    """Map a positional verdict back to the candidate: better than or as good as the reference.

    The candidate's position was randomised, so FIRST means "candidate" only when it was shown
    first. None (unparseable) stays None and scores 0.
    """
    if verdict is None:
        return None
    if verdict is Preference.TIE:
        return True
    if verdict is Preference.NEITHER:
        return False
    return (verdict is Preference.FIRST) == candidate_first
