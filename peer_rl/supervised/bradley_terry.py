"""The ESCRAG-R1 scalar reward model: its prompt, its pairs, the Bradley-Terry loss and pairwise
accuracy.

The reward model reads the conversation history and one counsellor reply and returns a scalar
(a sequence-classification head with one label, read at the last token). It is trained on
ESC-Preference pairs: loss = -log sigmoid(r(chosen) - r(rejected)), the Bradley-Terry model of
"chosen is preferred"; evaluated by pairwise accuracy (chosen scored higher; a tie counts half,
so a model that scores everything alike gets 0.5, not 0 or 1).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from peer_rl.prompts.quoting import line_starts, quote_policy_text, tokenizer_specials
from peer_rl.prompts.reasoning import render_history
from peer_rl.supervised.examples import load_rows

_INSTRUCTION = {
    "en": ("You evaluate a counselor's reply in an emotional-support conversation: does it "
           "address the client's emotional problem, given the conversation so far?\n\n"
           "Conversation:\n{history}\n\nCounselor's reply:\n{reply}"),
    "zh": ("你要评估情感支持对话中咨询师的回复：结合目前的对话，它是否回应了来访者的情绪问题？\n\n"
           "对话：\n{history}\n\n咨询师的回复：\n{reply}"),
}


_STARTS = line_starts(*_INSTRUCTION.values())


def rm_messages(history: list[dict], reply: str, lang: str, specials=()) -> list[dict]:
    """The chat the reward model scores (one user turn: the paper's reward-model prompt). The
    dialogue and the reply are quoted (`quote_policy_text`): a reply spelling the tokenizer's
    `<|im_end|>` (`specials`) or a line `Client: ...` adds no turn."""
    def quote(text):
        return quote_policy_text(text, specials, _STARTS)

    safe = [{**t, "content": quote(t["content"])} for t in history]
    return [{"role": "user", "content": _INSTRUCTION[lang].format(
        history=render_history(safe, lang), reply=quote(reply))}]


def rm_text(tokenizer, history: list[dict], reply: str, lang: str) -> str:
    return tokenizer.apply_chat_template(
        rm_messages(history, reply, lang, tokenizer_specials(tokenizer)), tokenize=False,
        add_generation_prompt=False)


def bt_loss(r_chosen: torch.Tensor, r_rejected: torch.Tensor, weight: torch.Tensor | None = None,
            reduction: str = "mean") -> torch.Tensor:
    """-log sigmoid(r_c - r_r) of each pair, times its `weight` (0: a padding pair, counted
    nowhere; default 1): their weighted mean, or with reduction="sum" their weighted sum (the
    trainer's micro-batches, divided by the global batch's pairs there)."""
    nll = -F.logsigmoid(r_chosen - r_rejected)
    if weight is not None:
        nll = nll * weight
    if reduction == "sum":
        return nll.sum()
    if reduction == "mean":
        return nll.sum() / (nll.new_tensor(float(nll.numel())) if weight is None else weight.sum())
    raise ValueError(f"reduction={reduction!r}: expected 'mean' or 'sum'")


def pairwise_accuracy(r_chosen, r_rejected) -> float:
    """Share of pairs scored the right way round; ties count half."""
    rc, rr = torch.as_tensor(r_chosen, dtype=torch.float64), torch.as_tensor(r_rejected,
                                                                              dtype=torch.float64)
    if rc.numel() == 0:
        return float("nan")
    return float(((rc > rr).double() + 0.5 * (rc == rr).double()).mean())


def pair_examples(rows: list[dict], tokenizer, max_length: int) -> tuple[list[dict], int]:
    """Tokenized (chosen, rejected) pairs; pairs longer than max_length are dropped and
    counted (never cut: the end of the reply is what the head reads)."""
    out, dropped = [], 0
    for row in rows:
        ids = [tokenizer(rm_text(tokenizer, row["history"], row[k], row["language"]),
                         add_special_tokens=False)["input_ids"] for k in ("chosen", "rejected")]
        if max(len(x) for x in ids) > max_length:
            dropped += 1
            continue
        out.append({"id": row["id"], "chosen": ids[0], "rejected": ids[1]})
    return out, dropped


def collate_pairs(pairs: list[dict], pad_id: int) -> dict[str, torch.Tensor]:
    """Chosen rows first, then rejected rows, right-padded: one forward for both halves."""
    seqs = [p["chosen"] for p in pairs] + [p["rejected"] for p in pairs]
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, :len(s)] = torch.tensor(s)
        mask[i, :len(s)] = 1
    return {"input_ids": ids, "attention_mask": mask}



def load_pairs(root, train_files, tokenizer, max_length: int, skip_invalid: bool = False,
               max_rows: int = 0) -> tuple[list[dict], dict]:
    """Tokenized pairs of every `preference/...` entry of data.train_files, with a summary."""
    pairs, summary = [], {"rows": 0, "too_long": 0, "invalid": 0, "files": {}}
    for rel in train_files:
        _, ds, n_bad, _ = load_rows(root, rel, skip_invalid)
        built, dropped = pair_examples([dict(r) for r in ds], tokenizer, max_length)
        pairs += built
        summary["files"][rel] = len(built)
        summary["rows"] += len(ds)
        summary["too_long"] += dropped
        summary["invalid"] += n_bad
    if max_rows:
        pairs = pairs[:max_rows]
    if not pairs:
        raise ValueError(f"no preference pairs in {list(train_files)} under {root} "
                         f"({summary['too_long']} longer than max_length={max_length})")
    summary["examples"] = len(pairs)
    return pairs, summary
