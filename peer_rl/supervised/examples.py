"""Supervised examples for `peer-rl train-rm` (SER) and `peer-rl sft` (sft/): tokens and labels.

Pure: rows in, token ids and labels out; no Ray, no model. A chat is rendered once with the
model's own chat template and tokenized as a whole (so ids are exactly what the model sees at
inference); the character spans of the trained assistant turns are found by rendering the chat
prefix by prefix, and a token is a target when it starts inside one of those spans.

Targets (everything else is -100, so prompt tokens carry no loss):
- SER rows (ser/): the 4 assistant verdict turns (3 step verdicts + the preference verdict);
  for the separate models PEER compares UnifiReward with, a view of the same rows: the process
  model (PRM) the chat through round 3 and its 3 step verdicts, the outcome model (ORM) one turn
  with the history and the two replies (peer_rl.prompts.judge.outcome_chat) and the preference;
- SFT rows (sft/): the last assistant turn (the Step 1-4 target);
- cold-start rows (cold_start/, ESCRAG-R1): the last assistant turn (`<think>...</think>reply`).
A target is the assistant content followed by the template's end-of-turn token (the EOS,
`<|im_end|>` for Qwen templates): the model must learn to stop after a verdict, or a greedy judge
runs on past it. The assistant header (`<|im_start|>assistant\\n`) and the newline after the
end token are prompt, not target.
"""
from __future__ import annotations

import json
import random
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from peer_rl.prompts.judge import JudgeTemplate, RowMismatch, TEMPLATE_FILE
from peer_rl.prompts.multimodal import attach_images, strip_tags
from peer_rl.supervised.config import JUDGE_KINDS

IGNORE_INDEX = -100


def target_turns(subset: str, messages: list[dict]) -> list[int]:
    """Indices of the assistant messages that carry loss for a row of `subset`."""
    assistant = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    if not assistant:
        raise ValueError("a supervised row needs at least one assistant message")
    if subset == "ser":
        return assistant                       # the 4 verdicts
    if subset in ("sft", "cold_start"):
        return assistant[-1:]                  # the structured / reasoning-response reply
    raise ValueError(f"subset {subset!r}: expected 'ser', 'sft' or 'cold_start'")


def _render(tokenizer, messages, add_generation_prompt: bool = False) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False,
                                         add_generation_prompt=add_generation_prompt)


def assistant_spans(tokenizer, messages: list[dict], turns: list[int]) -> tuple[str, list[tuple[int, int]]]:
    """The rendered chat and the [start, end) character span of each trained turn's target.

    Requires the template to be prefix-stable (rendering messages[:i] is a prefix of rendering
    messages), which holds for Qwen-style templates; a template that rewrites earlier turns
    (e.g. one that strips past reasoning) raises instead of mislabelling.
    """
    text = _render(tokenizer, messages)
    eos = tokenizer.eos_token or ""
    spans = []
    for i in turns:
        if messages[i]["role"] != "assistant":
            raise ValueError(f"message {i} is a {messages[i]['role']!r} turn, not assistant")
        head = _render(tokenizer, messages[:i], add_generation_prompt=True)
        through = _render(tokenizer, messages[:i + 1])
        if not text.startswith(through) or not through.startswith(head):
            raise ValueError("the chat template is not prefix-stable; cannot locate assistant "
                             f"turn {i} in the rendered chat")
        content = messages[i]["content"]
        rest = through[len(head):]
        at = rest.find(content)
        if at < 0:
            raise ValueError(f"assistant turn {i}: its content is not in the rendered chat")
        start = len(head) + at
        end = start + len(content)
        if eos and through.startswith(eos, end):
            end += len(eos)
        spans.append((start, end))
    return text, spans


def tokenize_chat(tokenizer, messages: list[dict], turns: list[int]) -> dict:
    """{'input_ids', 'labels'} (lists); labels are -100 outside the trained turns' targets."""
    text, spans = assistant_spans(tokenizer, messages, turns)
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = enc["input_ids"], enc["offset_mapping"]
    labels = [IGNORE_INDEX] * len(ids)
    j = 0
    for t, (a, b) in enumerate(offsets):
        while j < len(spans) and a >= spans[j][1]:
            j += 1
        if j < len(spans) and spans[j][0] <= a < spans[j][1] and b > a:
            labels[t] = ids[t]
    return {"input_ids": list(ids), "labels": labels}


@dataclass
class Examples:
    examples: list[dict]       # {'input_ids', 'labels', 'id', 'images'}
    n_rows: int                # rows read
    n_too_long: int            # dropped: longer than max_length tokens
    n_images: int              # rows with images (trained with them when `image_tokens` is given)


SER_STEP2_USER_TURN = 3        # system, (user 1, verdict), (user 2 = the Step 2 round), ...


def image_turn(subset: str, messages: list[dict]) -> int | None:
    """The message that receives a row's untagged images: the Step 2 round of a SER chat (where
    the judge infers the emotional state from face and words; the RL-time judge shows the frame
    there too) or the one user turn of an outcome model's chat, the last user turn (the policy
    prompt) of an SFT chat."""
    if subset != "ser":
        return None
    return SER_STEP2_USER_TURN if len(messages) > SER_STEP2_USER_TURN else 1


SER_VIEWS = ("unified", "process", "outcome")


def ser_view(rows, view: str, template=None) -> tuple[list[dict], int]:
    """SER rows as one judge of PEER's comparison is trained on them: `unified` (UnifiReward,
    all 4 rounds), `process` (a PRM: system + rounds 1-3), `outcome` (an ORM: the history and
    the two replies in one turn, read back through `template`, a JudgeTemplate). Returns the
    rows and how many the template could not read (outcome only: they are skipped)."""
    if view not in SER_VIEWS:
        raise ValueError(f"SER view {view!r}: expected one of {SER_VIEWS}")
    if view == "unified":
        return [dict(r) for r in rows], 0
    out, unread = [], 0
    for r in rows:
        if view == "process":
            out.append({**r, "messages": list(r["messages"][:7])})
            continue
        try:
            parts = template.match(strip_tags(r["messages"]), r["lang"])
        except RowMismatch:
            unread += 1
            continue
        out.append({**r, "messages": template.outcome_chat(parts, r["lang"])})
    return out, unread


def expand_image_tokens(ids: list[int], labels: list[int], image_token: int,
                        counts: list[int]) -> tuple[list[int], list[int]]:
    """One image token per image -> counts[i] tokens (what the processor does to the text);
    expanded positions carry no loss."""
    n_found = ids.count(image_token)
    if n_found != len(counts):
        raise ValueError(f"{n_found} image placeholder(s) in the chat for {len(counts)} image(s)")
    out_ids, out_labels, k = [], [], 0
    for t, lab in zip(ids, labels):
        if t == image_token:
            out_ids += [t] * counts[k]
            out_labels += [IGNORE_INDEX] * counts[k]
            k += 1
        else:
            out_ids.append(t)
            out_labels.append(lab)
    return out_ids, out_labels


def build_examples(rows, subset: str, tokenizer, max_length: int,
                   image_tokens=None, verdicts: bool = False) -> Examples:
    """Tokenize rows of one subset; chats over max_length are dropped, never truncated (a
    truncated SER chat would lose its preference verdict, a truncated SFT target its reply).

    image_tokens: (image_token_id, path -> number of tokens) for a vision-language model: rows
    with images are rendered with them (peer_rl.prompts.multimodal) and their placeholders expanded as
    the model's processor does; None trains every row on its words alone.
    verdicts: keep each example's target turns' contents (`verdicts`), for balance_verdicts."""
    out, too_long, images, n = [], 0, 0, 0
    for row in rows:
        n += 1
        paths = list(row.get("images") or []) if image_tokens else []
        msgs = (attach_images(row["messages"], paths, turn=image_turn(subset, row["messages"]))
                if paths else strip_tags(row["messages"]))
        turns = target_turns(subset, row["messages"])
        ex = tokenize_chat(tokenizer, msgs, turns)
        if paths:
            token, count = image_tokens
            ex["input_ids"], ex["labels"] = expand_image_tokens(
                ex["input_ids"], ex["labels"], token, [count(p) for p in paths])
        if len(ex["input_ids"]) > max_length:
            too_long += 1
            continue
        if not any(lab != IGNORE_INDEX for lab in ex["labels"][1:]):
            continue                            # nothing to learn (cannot happen for valid rows)
        images += bool(row.get("images"))
        if verdicts:
            ex["verdicts"] = [row["messages"][i]["content"].strip() for i in turns]
        out.append({**ex, "id": row.get("id", ""), "images": paths})
    return Examples(out, n, too_long, images)


def balance_verdicts(examples: list[dict]) -> dict:
    """Class-balanced verdict weights (trainer.verdict_balance): each target turn of a judge's
    chat is a verdict at a position (step 1, 2, 3, the preference); at each position every
    label weighs n / (k x count) (n verdicts there, k distinct labels), so each label's turns
    together weigh as much as any other's and the position's mean weight stays 1. A judge
    trained unweighted on SER's ~64% True steps answers True everywhere (error recall 0).
    Sets `turn_weights` on each example (from its `verdicts`, which it removes); returns
    {position: {label: (count, weight)}} for the log."""
    counts: dict[int, Counter] = {}
    for ex in examples:
        for pos, label in enumerate(ex["verdicts"]):
            counts.setdefault(pos, Counter())[label] += 1
    table = {pos: {label: (c, sum(cnt.values()) / (len(cnt) * c)) for label, c in cnt.items()}
             for pos, cnt in counts.items()}
    for ex in examples:
        ex["turn_weights"] = [table[pos][label][1] for pos, label in enumerate(ex.pop("verdicts"))]
    return table


def token_weights(labels: list[int], turn_weights: list[float]) -> list[float]:
    """Per-token loss weights: the k-th contiguous run of target labels is the k-th target turn
    (turns are separated by their prompt tokens) and takes turn_weights[k]; 0 elsewhere."""
    out, k, inside = [0.0] * len(labels), -1, False
    for t, lab in enumerate(labels):
        target = lab != IGNORE_INDEX
        if target and not inside:
            k += 1
        inside = target
        if target:
            if k >= len(turn_weights):
                raise ValueError(f"{k + 1} target runs but {len(turn_weights)} turn weights")
            out[t] = turn_weights[k]
    if k + 1 != len(turn_weights):
        raise ValueError(f"{k + 1} target runs but {len(turn_weights)} turn weights")
    return out


def load_rows(root: str | Path, rel: str, skip_invalid: bool = False, languages=()):
    """Validated rows of one `data.train_files` entry (a path under ser/ or sft/, globs allowed
    in the file part); returns (subset, datasets.Dataset, n_skipped_invalid, filtered: rows
    of other languages, per language)."""
    from peer_rl.data.loading import check_in_root, load_subset  # deferred: pulls in datasets

    check_in_root(root, rel, "data.train_files")
    parts = Path(rel).parts
    subset, pattern = parts[0], str(Path(*parts[1:]))
    res = load_subset(root, subset, pattern, skip_invalid=skip_invalid, languages=languages)
    return subset, res.dataset, res.n_skipped, res.filtered


def load_examples(root: str | Path, train_files, tokenizer, max_length: int,
                  skip_invalid: bool = False, max_rows: int = 0,
                  image_tokens=None, view: str = "unified",
                  template=None, languages=(), verdict_balance: bool = False
                  ) -> tuple[list[dict], dict]:
    """All examples of data.train_files, in file order, with a summary of what was read;
    SER rows are taken in `view` (ser_view; `template` reads them for the outcome view).
    verdict_balance: weight the verdicts by class (balance_verdicts; summary["verdicts"])."""
    examples, summary = [], {"rows": 0, "too_long": 0, "invalid": 0, "with_images": 0,
                             "unreadable": 0, "other_languages": {}, "files": {}}
    for rel in train_files:
        subset, ds, n_bad, filtered = load_rows(root, rel, skip_invalid, languages)
        for lang, n in filtered.items():
            summary["other_languages"][lang] = summary["other_languages"].get(lang, 0) + n
        if subset == "ser" and view != "unified":
            ds, unread = ser_view(ds, view, template)
            summary["unreadable"] += unread
        if verdict_balance and subset != "ser":
            raise ValueError(f"trainer.verdict_balance weighs a judge's verdicts: "
                             f"data.train_files entry {rel!r} is not SER rows")
        built = build_examples(ds, subset, tokenizer, max_length, image_tokens, verdict_balance)
        examples += built.examples
        summary["files"][rel] = len(built.examples)
        summary["rows"] += built.n_rows
        summary["too_long"] += built.n_too_long
        summary["invalid"] += n_bad
        summary["with_images"] += built.n_images
    if max_rows:
        examples = examples[:max_rows]
    if not examples:
        raise ValueError(f"no training examples in {list(train_files)} under {root} "
                         f"({summary['too_long']} longer than max_length={max_length})")
    if verdict_balance:
        summary["verdicts"] = balance_verdicts(examples)
    summary["examples"] = len(examples)
    summary["target_tokens"] = sum(sum(lab != IGNORE_INDEX for lab in e["labels"][1:])
                                   for e in examples)
    return examples, summary


# ---------------------------------------------------------------------------- batching
def steps_per_epoch(n_examples: int, batch_size: int) -> int:
    return -(-n_examples // batch_size)


def batch_indices(n_examples: int, batch_size: int, step: int, seed: int) -> list[int]:
    """Example indices of global optimizer step `step` (0-based): epoch e = step // steps_per_epoch
    walks a permutation seeded by (seed, e); the last batch of an epoch may be short. A function
    of (step, seed) only, so a resumed run sees exactly the batches an uninterrupted one would."""
    spe = steps_per_epoch(n_examples, batch_size)
    epoch, i = divmod(step, spe)
    order = list(range(n_examples))
    random.Random(f"{seed}-{epoch}").shuffle(order)
    return order[i * batch_size:(i + 1) * batch_size]


def rank_rows(indices: list[int], rank: int, world_size: int) -> tuple[list[int], list[bool]]:
    """This rank's share (indices[rank::ws]) padded to ceil(len/ws) entries so every rank runs the
    same number of forward/backward passes (FSDP collectives must line up); the bool marks real
    rows, padding rows repeat indices[0] and get no labels."""
    mine = indices[rank::world_size]
    per = -(-len(indices) // world_size)
    pad = per - len(mine)
    return mine + [indices[0]] * pad, [True] * len(mine) + [False] * pad


def count_targets(example: dict) -> float:
    """Tokens that carry loss (labels shifted by one: position 0 is never predicted), each
    counted at its verdict weight when the example has turn weights."""
    if "turn_weights" in example:
        return sum(token_weights(example["labels"], example["turn_weights"])[1:])
    return sum(lab != IGNORE_INDEX for lab in example["labels"][1:])


def collate(examples: list[dict], pad_id: int, real: list[bool] | None = None,
            pad_to_multiple_of: int = 1) -> dict:
    """Right-padded LongTensors input_ids, attention_mask, labels (B, T), and float `weights`
    (B, T) when the examples have turn weights (balance_verdicts). Rows with real=False (rank
    padding) keep their tokens but get no labels."""
    import torch  # deferred: torch (~2 s); the CLI starts without it

    real = real if real is not None else [True] * len(examples)
    longest = max(len(e["input_ids"]) for e in examples)
    width = -(-longest // pad_to_multiple_of) * pad_to_multiple_of
    ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(examples), width), dtype=torch.long)
    labels = torch.full((len(examples), width), IGNORE_INDEX, dtype=torch.long)
    weighted = any("turn_weights" in e for e in examples)
    weights = torch.zeros((len(examples), width), dtype=torch.float32)
    for r, (e, ok) in enumerate(zip(examples, real)):
        n = len(e["input_ids"])
        ids[r, :n] = torch.tensor(e["input_ids"])
        attn[r, :n] = 1
        if ok:
            labels[r, :n] = torch.tensor(e["labels"])
            if weighted:
                weights[r, :n] = torch.tensor(token_weights(e["labels"], e["turn_weights"]))
    out = {"input_ids": ids, "attention_mask": attn, "labels": labels}
    return out | ({"weights": weights} if weighted else {})


def lr_schedule(optimizer, lr: float, total_steps: int, warmup_steps: int = 0,
                scheduler: str = "constant", min_lr_ratio: float = 0.0, start_step: int = 0):
    """transformers' linear warmup then constant, or cosine down to min_lr_ratio x lr, placed
    at optimizer step `start_step` (0-based): a resumed run needs no scheduler state. Call
    `.step()` after each optimizer step."""
    from transformers import (get_constant_schedule_with_warmup,
                              get_cosine_with_min_lr_schedule_with_warmup)  # deferred: transformers

    for g in optimizer.param_groups:    # the base rate, whatever a loaded optimizer state holds
        g["initial_lr"] = lr
    if scheduler == "cosine":
        return get_cosine_with_min_lr_schedule_with_warmup(
            optimizer, warmup_steps, total_steps, min_lr_rate=min_lr_ratio,
            last_epoch=start_step - 1)
    return get_constant_schedule_with_warmup(optimizer, warmup_steps, last_epoch=start_step - 1)


def example_view(kind: str, extra_files: dict) -> dict:
    """load_examples' view arguments for a judge kind (the template read from its JSON)."""
    if kind not in JUDGE_KINDS or JUDGE_KINDS[kind] == "unified":
        return {}
    raw = json.loads(extra_files[TEMPLATE_FILE])
    return {"view": JUDGE_KINDS[kind], "template": JudgeTemplate(text=raw["text"])}
