"""The dialogue history a GRPO row carries: decided here, once, for every part of a run.

The policy's prompt (the row's `messages`), the judge, RUR's history similarity, ESCRAG-R1's two
passes and its reward model, the retrieval query and the verl export all read the row's
`history`; this module is the only place that may shorten it, so they all see the turns the
policy was shown. By default (`max_turns` 0) nothing is cut. With a cap, the last `max_turns`
turns stay and the policy's prompt is cut with them: the rendered history inside the prompt is
replaced by the rendering of the kept turns (the rendering read off the rows themselves,
peer_rl.prompts.policy.fit_policy_template), and a row whose prompt does not hold its history in
that rendering is refused rather than trained on a prompt that disagrees with its judge.

`dialogue_history` keeps the whole dialogue before any cut. It is the row's identity, not
something any model reads: the retrieval's exclusion of the query's own dialogue
(peer_rl.retrieval.index.same_dialogue) compares it, so no cut can make a prompt's own reply
retrievable.
"""
from __future__ import annotations

from peer_rl.errors import ConfigError
from peer_rl.prompts.policy import fit_policy_template


def cut(history: list[dict], max_turns: int) -> list[dict]:
    """The last `max_turns` turns; the whole history when `max_turns` is 0."""
    if max_turns < 0:
        raise ConfigError(f"data.max_history_turns={max_turns}: expected 0 (the whole dialogue) "
                          "or a positive number of turns")
    return list(history[-max_turns:]) if max_turns else list(history)


def training_rows(rows: list[dict], max_turns: int = 0) -> list[dict]:
    """`rows` (validated grpo rows) as a run uses them: `history` cut to `max_turns` (0 = whole),
    `messages` holding exactly that history, `dialogue_history` the whole dialogue."""
    out = [{**r, "dialogue_history": list(r["history"])} for r in rows]
    long = [r for r in out if max_turns and len(r["history"]) > max_turns]
    if not long:
        return out

    template, _ = fit_policy_template(rows)
    for r in long:
        kept = cut(r["history"], max_turns)
        r["messages"] = _cut_prompt(r, kept, template, max_turns)
        r["history"] = kept
    return out


def _cut_prompt(row: dict, kept: list[dict], template, max_turns: int) -> list[dict]:
    """The row's messages with its rendered whole history replaced by the kept turns'."""
    whole = template.history_text(row["history"], row["language"])
    short = template.history_text(kept, row["language"])
    messages = [dict(m) for m in row["messages"]]
    user = next((m for m in reversed(messages) if m["role"] == "user"), None)
    if user is None or not isinstance(user["content"], str) or \
            user["content"].count(whole) != 1:
        raise ConfigError(
            f"data.max_history_turns={max_turns}: grpo row {row.get('id')!r}: its prompt does not "
            "hold its history once as the rows' own rendering writes it, so the policy's prompt "
            "cannot be cut with the history; set data.max_history_turns=0 (the whole dialogue)")
    user["content"] = user["content"].replace(whole, short)
    return messages
