"""Whole conversations between the policy and a simulated seeker: the rollout of training on
dialogues.

A dialogue is written as a program (a generator), the way `eval sage` writes its cases: it
yields `("policy", messages)` when the policy must answer and receives that answer (a
protocol.Sample), and `("seeker", (messages, schema))` when the seeker must speak (schema: the
JSON its answer must be, or None) and receives its text. `run_dialogues` keeps every live dialogue in lock-step, so each party is called once a
turn with the requests of all the dialogues still going: a dialogue that ends early simply asks
nothing more and frees its place in the batch.

The policy party answers None where the prompt would leave its reply no room in
rollout.max_model_len: the dialogue ends there (`length`), trained as far as it got.

What each party sees:
- the policy, each turn, its own prompt (PEER's Steps 1-4 instruction) over the dialogue so
  far, where its earlier turns appear as the seeker read them (Step 4), as in PEER's rows;
- the seeker, SAGE's two calls after each policy turn (peer_rl.prompts.seeker): the analyser
  (its emotion change, a JSON answer) and its reply; it reads the policy's Step 4 only, never
  its reasoning, and its emotion follows peer_rl.algos.emotion.
"""
from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field

from peer_rl.algos.emotion import EmotionRules, emotion_end, next_emotion
from peer_rl.prompts.answers import is_goodbye, json_field, parse_int
from peer_rl.prompts.policy import PolicyTemplate
from peer_rl.prompts.reasoning import ParsedOutput, parse_structured
from peer_rl.prompts.seeker import (CHANGE_SCHEMA, sage_analyse_messages, sage_reply_messages,
                                    seeker_line)

LANGS = {"english": "en", "chinese": "zh", "en": "en", "zh": "zh"}


@dataclass(frozen=True)
class SeekerProfile:
    """Who the seeker is: its system prompt (a SAGE profile or an ESC-Eval role card,
    rendered), its first message (None: not written yet; a role card has none) and its
    language."""
    id: str
    persona: str
    opening: str | None
    language: str              # "en" or "zh"


@dataclass
class PolicyTurn:
    history: list[dict]        # the dialogue the policy was shown (seeker / supporter turns)
    sample: object             # protocol.Sample: the policy's answer, token ids and log-probs
    parsed: ParsedOutput       # its steps; .reply is what the seeker read
    change: int | None = None  # the seeker's stated change (None: unparseable, counted as 0)
    emotion: int = 0           # the seeker's emotion after this turn
    analysis: str = ""         # the analyser's answer
    seeker: str | None = None  # the seeker's next message (None: the dialogue ended here)


@dataclass
class Dialogue:
    uid: int                   # its GRPO group (the profile's row in the step's batch)
    profile: SeekerProfile
    turns: list[PolicyTurn] = field(default_factory=list)
    trajectory: list[int] = field(default_factory=list)   # the emotion, start first
    end: str = ""              # peer_rl.algos.emotion.ENDS


DialogueProgram = Generator[tuple, object, Dialogue]


class DialogueTooLong(ValueError):
    """A dialogue whose first policy prompt does not fit the rollout engine's context."""


def dialogue(uid: int, profile: SeekerProfile, template: PolicyTemplate, max_turns: int,
             rules: EmotionRules = EmotionRules()) -> DialogueProgram:
    """One conversation, up to `max_turns` policy turns."""
    if profile.opening is None:
        raise ValueError(f"seeker {profile.id!r}: a dialogue needs its first message")
    lang = profile.language
    out = Dialogue(uid, profile, trajectory=[rules.start])
    history = [{"role": "seeker", "content": profile.opening}]
    emotion = rules.start
    for _ in range(max_turns):
        sample = yield "policy", template.messages(history, lang)
        if sample is None:           # the prompt would leave the reply no room
            if not out.turns:
                raise DialogueTooLong(f"seeker {profile.id!r}: the policy's first prompt "
                                      "leaves no room for its reply in rollout.max_model_len - "
                                      "rollout.response_length tokens; raise "
                                      "rollout.max_model_len or shorten the seeker's opening")
            out.end = "length"
            return out
        parsed = parse_structured(sample.text)
        turn = PolicyTurn(list(history), sample, parsed)
        out.turns.append(turn)
        history.append({"role": "supporter", "content": parsed.reply})
        turn.analysis = yield "seeker", (sage_analyse_messages(profile.persona, history,
                                                               emotion, lang), CHANGE_SCHEMA)
        turn.change = parse_int(turn.analysis, "change", -rules.max_change, rules.max_change,
                                ("变化", "情绪变化"))
        emotion = turn.emotion = next_emotion(emotion, turn.change, rules)
        out.trajectory.append(emotion)
        if emotion_end(emotion, rules):
            out.end = emotion_end(emotion, rules)
            return out
        reaction = json_field(turn.analysis, "reaction")
        reaction = reaction if isinstance(reaction, str) else turn.analysis
        text = yield "seeker", (sage_reply_messages(profile.persona, history, emotion, reaction,
                                                    lang), None)
        turn.seeker = seeker_line(text)
        history.append({"role": "seeker", "content": turn.seeker})
        if is_goodbye(turn.seeker):
            out.end = "goodbye"
            return out
    out.end = "max_turns"
    return out


Party = Callable[[list], list]


def run_dialogues(programs: Sequence[DialogueProgram], parties: dict[str, Party]
                  ) -> list[Dialogue]:
    """Every program to its end, in lock-step: each round, each party is called once with the
    requests of every program waiting on it, in program order, and answers each in that
    order."""
    done: dict[int, Dialogue] = {}
    waiting: dict[int, tuple] = {}

    def advance(k: int, answer) -> None:
        try:
            waiting[k] = programs[k].send(answer)
        except StopIteration as stop:
            done[k] = stop.value

    for k in range(len(programs)):
        advance(k, None)
    while waiting:
        by_role: dict[str, list[int]] = {}
        for k, request in waiting.items():
            by_role.setdefault(request[0], []).append(k)
        asked, waiting = waiting, {}
        for role, ks in by_role.items():
            if role not in parties:
                raise KeyError(f"a dialogue asked the {role!r} party; parties: {sorted(parties)}")
            answers = parties[role]([asked[k][1] for k in ks])
            if len(answers) != len(ks):
                raise RuntimeError(f"the {role} party answered {len(answers)} of "
                                   f"{len(ks)} requests")
            for k, answer in zip(ks, answers):
                advance(k, answer)
    return [done[k] for k in range(len(programs))]
