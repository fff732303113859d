"""Reward math: the PEER reward, reply length and RUR reweighting (the judge's verdicts are
read in peer_rl.prompts.verdicts).

Everything here is a function of strings and arrays: no model, no Ray, no run config (a
setting such as the reward's weights comes in as an argument).
"""
from __future__ import annotations

import re

import numpy as np


def peer_reward(step_verdicts, preference_ok, format_complete, weights) -> float:
    """r = weights.step x #(steps True) + weights.preference x [pref ok] + weights.format x
    [format complete]; `weights` is reward_model.weights (RewardWeights: 0.5, 0.5, 1 by
    default, so r in [0, 3]). Passed, never defaulted here, so that no caller scores with
    weights other than the run's."""
    steps = sum(v is True for v in step_verdicts)
    return float(weights.step * steps + weights.preference * (preference_ok is True)
                 + weights.format * bool(format_complete))


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


def peer_similarity(replies: np.ndarray, groups, agg: str = "mean") -> np.ndarray:
    """s^in where groups differ in size (whole conversations: the replies the group's dialogues
    gave at one turn, some dialogues having ended): mean (or max) cosine between each reply
    and the others with its group id; 0 for a reply alone. One masked (N, N) product."""
    groups = np.asarray(groups)
    if len(replies) == 0:
        return np.zeros(0)
    e = _unit(replies)
    sims = e @ e.T
    peers = (groups[:, None] == groups[None, :]) & ~np.eye(len(groups), dtype=bool)
    n_peers = peers.sum(axis=1)
    if agg == "mean":
        out = np.where(peers, sims, 0.0).sum(axis=1) / np.maximum(n_peers, 1)
    elif agg == "max":
        out = np.where(peers, sims, -np.inf).max(axis=1)
    else:
        raise ValueError(f"group aggregator {agg!r}: expected 'mean' or 'max'")
    return np.clip(np.where(n_peers > 0, out, 0.0), 0.0, 1.0)
