"""Reward math: verdict parsing, the PEER reward and RUR reweighting.

Everything here is a function of strings and arrays: no model, no Ray, no config object.
"""
from __future__ import annotations

import enum
import re

import numpy as np

from peer_rl.verdict_text import Label, read_label


class Preference(enum.IntEnum):
    FIRST = 0     # "The first sentence is better"      / 第一句更好
    SECOND = 1    # "The second sentence is better"     / 第二句更好
    TIE = 2       # "The two sentences are almost good" / 差不多
    NEITHER = 3   # "Neither sentence is available"     / 都不可用


# What a judge's answer may say (read by peer_rl.verdict_text: negations flip True/False,
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


STEP_WEIGHT = 0.5        # per reasoning step judged True
PREFERENCE_WEIGHT = 0.5  # candidate better than or about as good as the reference
FORMAT_WEIGHT = 1.0      # all four steps present


def peer_reward(step_verdicts, preference_ok, format_complete) -> float:
    """r = 0.5 * #(steps True) + 0.5 * [pref ok] + 1 * [format complete], in [0, 3]."""
    steps = sum(STEP_WEIGHT for v in step_verdicts if v is True)
    return float(steps + PREFERENCE_WEIGHT * (preference_ok is True)
                 + FORMAT_WEIGHT * bool(format_complete))


def peer_rewards(step_true: np.ndarray, preference_ok: np.ndarray,
                 format_complete: np.ndarray) -> np.ndarray:
    """Batched peer_reward: step_true (N, 3) bool (None/unparseable already False)."""
    return (STEP_WEIGHT * np.asarray(step_true, dtype=np.float64).sum(axis=-1)
            + PREFERENCE_WEIGHT * np.asarray(preference_ok, dtype=np.float64)
            + FORMAT_WEIGHT * np.asarray(format_complete, dtype=np.float64))


_CJK = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\u3040-\u30ff\uac00-\ud7af]")


CJK_CHARS_PER_WORD = 1.5


def count_words(text: str, cjk_chars_per_word: float = CJK_CHARS_PER_WORD) -> float:
    """Length L of the RUR length coefficient, in English-word equivalents: whitespace words,
    plus CJK characters / cjk_chars_per_word. Counting each Chinese character as a word would
    make tau saturate after ~10 characters (a short Chinese reply would be penalised like a
    20-word English one); running Chinese text has about 1.5 characters per word, and the
    bundled sample's supporter replies average 49.7 characters (zh) against 34.7 words (en) for
    the same kind of content (ratio 1.43). Pass 1.0 to count characters as words."""
    n_cjk = len(_CJK.findall(text))
    rest = _CJK.sub(" ", text)
    n_words = sum(1 for tok in rest.split() if any(ch.isalnum() for ch in tok))
    return n_cjk / cjk_chars_per_word + n_words


def length_coefficient(n_words, alpha: float = 0.5, beta: float = 5.0):
    """tau = sigmoid(alpha * (L - beta)): short replies are barely penalised for redundancy."""
    x = alpha * (np.asarray(n_words, dtype=np.float64) - beta)
    tau = 1.0 / (1.0 + np.exp(-x))
    return float(tau) if np.ndim(tau) == 0 else tau


def rur_reweight(rewards, s_hist, s_group, tau) -> np.ndarray:
    """RUR with the penalty P_i = (1 + tau_i s_i^hi)(1 + tau_i s_i^in) >= 1, similarities clipped
    to [0, 1]: r~_i = r_i / P_i for r_i >= 0 (the paper's formula; its rewards are in [0, 3]) and
    r~_i = r_i * P_i for r_i < 0. Dividing a negative reward (a Bradley-Terry score) by P would
    move it toward 0, so a more redundant reply would score higher; multiplying moves it away,
    so for either sign a more redundant reply never scores higher."""
    r = np.asarray(rewards, dtype=np.float64)
    tau = np.asarray(tau, dtype=np.float64)
    s_hi = np.clip(np.asarray(s_hist, dtype=np.float64), 0.0, 1.0)
    s_in = np.clip(np.asarray(s_group, dtype=np.float64), 0.0, 1.0)
    penalty = (1.0 + tau * s_hi) * (1.0 + tau * s_in)
    return np.where(r >= 0.0, r / penalty, r * penalty)


def _unit(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


def history_similarity(replies: np.ndarray, history: np.ndarray, history_owner: np.ndarray,
                       reply_owner: np.ndarray, agg: str = "max") -> np.ndarray:
    """s^hi: max (or mean) cosine between each reply and the history utterances of its prompt.

    replies (N, d), history (M, d); history_owner (M,) and reply_owner (N,) give the prompt index
    of each row. One (N, M) product, masked to same-prompt pairs; a prompt with no history -> 0.
    """
    if len(history) == 0 or len(replies) == 0:
        return np.zeros(len(replies))
    sims = _unit(replies) @ _unit(history).T
    same = np.asarray(reply_owner)[:, None] == np.asarray(history_owner)[None, :]
    n_same = same.sum(axis=1)
    if agg == "max":
        out = np.where(same, sims, -np.inf).max(axis=1)
    elif agg == "mean":
        out = np.where(same, sims, 0.0).sum(axis=1) / np.maximum(n_same, 1)
    else:
        raise ValueError(f"history aggregator {agg!r}: expected 'max' or 'mean'")
    return np.clip(np.where(n_same > 0, out, 0.0), 0.0, 1.0)


def group_similarity(replies: np.ndarray, group_size: int, agg: str = "mean") -> np.ndarray:
    """s^in: mean (or max) cosine between each reply and the other G-1 replies of its group.

    replies (B*G, d) ordered group by group; one batched (B, G, G) product.
    """
    g = group_size
    if g < 2:
        return np.zeros(len(replies))
    e = _unit(replies).reshape(-1, g, replies.shape[-1])
    sims = e @ e.transpose(0, 2, 1)
    if agg == "mean":
        out = (sims.sum(axis=2) - np.diagonal(sims, axis1=1, axis2=2)) / (g - 1)
    elif agg == "max":
        out = np.where(np.eye(g, dtype=bool)[None], -np.inf, sims).max(axis=2)
    else:
        raise ValueError(f"group aggregator {agg!r}: expected 'mean' or 'max'")
    return np.clip(out.reshape(-1), 0.0, 1.0)
