"""One item's judging as a conversation, apart from the engine that answers it.

The judge sees system + up to 4 x (user, assistant): the rounds its template's role asks, each
carrying the judge's earlier answers. `JudgeRounds.dialogue` yields each round's chat and is sent
the answer, so one definition serves an in-process engine answering many items round by round
(`answer_all`, the UnifiReward worker) and an HTTP judge answering one item at a time (the verl
plug-in): both ask exactly the same chats, and `judge_result` turns the answers into the same
JudgeResult.
"""
from __future__ import annotations

import hashlib
from collections.abc import Callable, Generator

from peer_rl.prompts.judge import JudgeTemplate
from peer_rl.prompts.quoting import tokenizer_specials
from peer_rl.protocol import JudgeItem, JudgeResult
from peer_rl.algos.rewards import peer_reward
from peer_rl.prompts.verdicts import candidate_preference_ok, parse_preference, parse_step_verdict

Dialogue = Generator[tuple[int, list[dict]], str, list[str | None]]   # yields (round, chat)


class JudgeRounds:
    """The rounds a judge (its template and tokenizer, its context length) is asked for an item.

    Missing steps (None) are not asked. Turns are fitted to the context by dropping the oldest
    history utterances until the whole chat, with room for every answer, fits.
    """

    def __init__(self, template: JudgeTemplate, tokenizer, max_model_len: int, max_tokens: int):
        self.template, self.tokenizer = template, tokenizer
        self.max_model_len, self.max_tokens = max_model_len, max_tokens
        # the policy's text must not be able to close a judge turn (quoting.quote_policy_text)
        template.specials = tokenizer_specials(tokenizer)

    def _turns(self, item: JudgeItem, history: list[dict]) -> list[dict | None]:
        """The 4 round slots this judge is asked (None: not asked), by its template's role."""
        role = self.template.role
        if role == "outcome" and item.reference is None:    # nothing to compare the reply with
            return [None] * 4
        if role == "outcome":
            first, second = ((item.reply, item.reference) if item.candidate_first
                             else (item.reference, item.reply))
            return [None, None, None, self.template.outcome_turn(first, second, history,
                                                                 item.lang)]
        turns = self.template.item_turns(item, history)
        return turns[:3] + [None] if role == "process" else turns

    def turns(self, item: JudgeItem) -> list[dict | None]:
        """The item's round slots, the oldest history turns dropped until the chat fits."""
        lang = self.template.language(item.lang)
        history = list(item.history)
        while True:
            turns = self._turns(item, history)
            msgs = [self.template.system(lang)]
            for t in turns:
                if t is not None:
                    msgs += [t, {"role": "assistant", "content": "x" * 8}]
            text = self.tokenizer.apply_chat_template(msgs, tokenize=False)
            n = len(self.tokenizer.encode(text, add_special_tokens=False))
            if n + 4 * self.max_tokens <= self.max_model_len or not history:
                return turns
            history = history[1:]

    def dialogue(self, item: JudgeItem, turns: list[dict | None] | None = None) -> Dialogue:
        """Yields (round, chat) for each asked round, is sent the judge's answer (stripped
        here); returns the 4 answer slots (None where not asked)."""
        turns = self.turns(item) if turns is None else turns
        conv = [self.template.system(self.template.language(item.lang))]
        answers: list[str | None] = [None] * 4
        for k, turn in enumerate(turns):
            if turn is None:
                continue
            text = (yield k, conv + [turn]).strip()
            conv += [turn, {"role": "assistant", "content": text}]
            answers[k] = text
        return answers


def answer_all(dialogues: list[Dialogue],
               answer: Callable[[list[list[dict]]], list[str]]) -> list[list[str | None]]:
    """Drives many dialogues round by round: one batched `answer` call per round for every
    dialogue that asks it (a missing step is skipped, not asked), so an engine serves a round's
    shared system prefix from its cache."""
    out: list[list[str | None] | None] = [None] * len(dialogues)
    pending: dict[int, tuple[int, list[dict]]] = {}
    for i, d in enumerate(dialogues):
        _advance(i, d, None, pending, out)
    for k in range(4):
        asked = [i for i, (round_, _) in pending.items() if round_ == k]
        if not asked:
            continue
        for i, text in zip(asked, answer([pending[i][1] for i in asked])):
            _advance(i, dialogues[i], text, pending, out)
    return out


def _advance(i: int, d: Dialogue, text: str | None, pending: dict, out: list) -> None:
    try:
        pending[i] = next(d) if text is None else d.send(text)
    except StopIteration as stop:
        pending.pop(i, None)
        out[i] = stop.value


def candidate_coin(seed: int, group: str, text: str) -> bool:
    """Which side of round 4 the candidate takes where no step counter is shared (the verl
    plug-in): a coin from (seed, group, response), so the judge's position bias averages out
    over samples and a rerun asks the same way."""
    return bool(hashlib.sha256(f"{seed}\0{group}\0{text}".encode()).digest()[0] & 1)


def judge_result(item: JudgeItem, ans: list[str | None], weights) -> JudgeResult:
    """Verdicts parsed from the answer slots and PEER's reward with `weights` (its step,
    preference and format: reward_model.weights, or the verl plug-in's
    reward_kwargs.weights); an unparseable answer scores 0 and counts in `parse_failures`,
    never raises."""
    steps = [None if a is None else parse_step_verdict(a) for a in ans[:3]]
    verdict = parse_preference(ans[3]) if ans[3] is not None else None
    pref_ok = candidate_preference_ok(verdict, item.candidate_first)
    asked = sum(a is not None for a in ans)
    failures = sum(a is not None and v is None for a, v in zip(ans, steps + [verdict]))
    return JudgeResult(
        step_verdicts=steps, preference=None if verdict is None else int(verdict),
        preference_ok=pref_ok, reward=peer_reward(steps, pref_ok, item.format_complete, weights),
        parse_failures=failures, asked=asked, raw=[a or "" for a in ans])
