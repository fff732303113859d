"""A GRPO step's tokens, from the recipe alone (no data read, no tokenizer loaded), and the step
time they take at a throughput the user gives: what `peer-rl plan` prints under the memory.

Prompt length: the longest prompt a run admits, rollout.max_model_len - rollout.response_length
(peer_rl.trainer.prompt_lengths refuses a longer one), unless the user states the data's; every
reply at rollout.response_length. Both are upper bounds, so the tokens and the time are too.

Rollout: every sample's prompt is prefilled and its reply generated; ESCRAG-R1 (retrieval.enable)
writes a second, refined reply per sample, whose prompt is counted at the same length.
Update (peer_rl.workers.policy): actor.ppo_epochs training passes (forward and backward) over every
sample, the reference's no-grad forward, and the policy's own no-grad forward for the old
log-probs unless the update is on-policy (one epoch, one mini-batch: `OldLogProbs.ON_POLICY`).
With actor.shared_prefix on (auto: packed rows) each pass runs a group's
prompt once and its rollout.n replies after it (peer_rl.compute.shared_prefix): groups held whole
in a forward, which a token budget below a group's tokens would not give. ESCRAG-R1's refined
rows share only their dialogue (they differ after it, in the initial reply and exemplars), a
part of the prompt the plan does not know: they are counted whole, an upper bound.
"""
from __future__ import annotations

from dataclasses import dataclass

from peer_rl.config.worker_settings import shared_prefix_on


@dataclass(frozen=True)
class StepTokens:
    prompts: int                 # data.train_batch_size
    samples: int                 # rollout sequences a pass writes: prompts x rollout.n
    passes: int                  # rollout passes a step (ESCRAG-R1 with retrieval: 2;
                                 # dialogues: dialogue.max_turns, one a turn)
    trained: int                 # samples the update trains on
    prompt: int                  # tokens of a prompt
    response: int                # tokens of a reply
    epochs: int                  # actor.ppo_epochs
    old_pass: bool               # the old log-probs' no-grad forward runs
    shared: bool = False         # a group's prompt runs once in each pass (actor.shared_prefix)
    group: int = 1               # rows a prompt: rollout.n

    @property
    def generated(self) -> int:
        return self.passes * self.samples * self.response

    @property
    def rollout(self) -> int:
        """Tokens the rollout engines process: every pass's prompts prefilled, replies written."""
        return self.passes * self.samples * (self.prompt + self.response)

    @property
    def sequence(self) -> int:
        return self.prompt + self.response

    @property
    def update_pass(self) -> int:
        """Tokens one pass over the trained samples runs (a shared prompt once a group)."""
        if self.shared:
            return -(-self.trained // self.group) * self.prompt + self.trained * self.response
        return self.trained * self.sequence

    @property
    def update_trained(self) -> int:
        return self.epochs * self.update_pass

    @property
    def update_no_grad(self) -> int:
        """The reference's forward, and the old log-probs' unless on-policy."""
        return (1 + self.old_pass) * self.update_pass

    @property
    def update(self) -> int:
        return self.update_trained + self.update_no_grad


def shares_prefix(cfg) -> bool:
    """Whether actor.shared_prefix is on for this config (peer_rl.compute.shared_prefix.resolve,
    as the policy ranks decide it) and its trained rows share whole prompts (ESCRAG-R1's refined
    rows share only their dialogue: counted whole)."""
    return (shared_prefix_on(cfg.actor.shared_prefix, cfg.actor.use_remove_padding)
            and not cfg.retrieval.enable and not cfg.dialogue.enable)


def step_tokens(cfg, prompt_length: int = 0) -> StepTokens:
    """A GRPO config's step, prompts of `prompt_length` tokens (0: the longest admitted)."""
    r, a = cfg.rollout, cfg.actor
    prompt = prompt_length or max(r.max_model_len - r.response_length, 0)
    samples = cfg.data.train_batch_size * r.n
    two = bool(cfg.retrieval.enable)
    trained = samples * (2 if two and cfg.retrieval.train_initial else 1)
    passes = 2 if two else 1
    if cfg.dialogue.enable:     # each policy turn a pass and a trained row, at most max_turns
        passes = cfg.dialogue.max_turns
        trained = samples * passes
    behavior = cfg.trainer.async_training.staleness > 0 and bool(a.behavior_weight_cap)
    on_policy = a.ppo_epochs == 1 and trained <= a.ppo_mini_batch_size * r.n and not behavior
    return StepTokens(cfg.data.train_batch_size, samples, passes, trained, prompt,
                      r.response_length, a.ppo_epochs, not on_policy,
                      shares_prefix(cfg), r.n)


STAGES = ("rollout", "update")


def parse_throughput(text: str, needs: tuple[str, ...] = STAGES) -> dict[str, float]:
    """`rollout=TOK/S,update=TOK/S` -> {"rollout": ..., "update": ...}: the stages in `needs`
    (a supervised stage: update alone), each a number above 0, else a ValueError naming what
    was expected."""
    expected = ("expected --throughput " + ",".join(f"{k}=TOK/S" for k in needs)
                + " (tokens per second, numbers above 0)")
    out: dict[str, float] = {}
    for item in filter(None, (x.strip() for x in text.split(","))):
        key, sep, value = item.partition("=")
        try:
            number = float(value)
        except ValueError:
            number = float("nan")
        if not sep or key not in needs or key in out or not 0 < number < float("inf"):
            raise ValueError(f"--throughput {text}: {item!r}: {expected}")
        out[key] = number
    if set(out) != set(needs):
        raise ValueError(f"--throughput {text}: {expected}")
    return out


def step_seconds(tokens: StepTokens, throughput: dict[str, float]) -> dict[str, float]:
    """Seconds of each stage: the rollout's generated tokens at its generated tokens/s (decode
    dominates a rollout; `rollout/tokens_per_s` in a run's metrics.jsonl measures the same), the
    update's tokens (every pass, as counted here) at its tokens/s."""
    return {"rollout": tokens.generated / throughput["rollout"],
            "update": tokens.update / throughput["update"]}


def _n(x: float) -> str:
    return f"{x:,.0f}"


def _duration(s: float) -> str:
    return f"{s / 3600:.1f} h" if s >= 3600 else f"{s / 60:.1f} min" if s >= 60 else f"{s:.1f} s"


def render_tokens(tokens: StepTokens, stated_prompt: bool, dialogue: bool = False) -> list[str]:
    """`dialogue`: the passes are a dialogue's turns (dialogue.enable)."""
    t = tokens
    where = ("--prompt-length" if stated_prompt else "rollout.max_model_len - "
             "rollout.response_length, the longest a run admits; --prompt-length sets yours")
    passes = ("2 passes (initial, refined) x " if t.passes == 2 and not dialogue
              else f"{t.passes} turns x " if dialogue else "")
    epochs = f"{t.epochs} training epoch{'s' if t.epochs > 1 else ''}"
    old = ", the old log-probs'" if t.old_pass else ""
    if t.shared:
        rows = (f"({-(-t.trained // t.group)} prompts x {_n(t.prompt)} + {t.trained} replies x "
                f"{_n(t.response)}: actor.shared_prefix)")
    else:
        rows = f"{t.trained} sequences x {_n(t.sequence)}"
    return [f"tokens per step, at most (prompts of {_n(t.prompt)}: {where}; replies of "
            f"{_n(t.response)}: rollout.response_length):",
            f"  rollout  {passes}{t.prompts} prompts x {t.samples // t.prompts} samples x "
            f"({_n(t.prompt)} + {_n(t.response)}) = {_n(t.rollout)} ({_n(t.generated)} generated)",
            f"  update   {rows} x ({epochs} + the reference's"
            f"{old} forward) = {_n(t.update)} ({_n(t.update_trained)} trained, "
            f"{_n(t.update_no_grad)} forward only)"]


def render_step_time(tokens: StepTokens, throughput: dict[str, float], steps: int) -> list[str]:
    s = step_seconds(tokens, throughput)
    total = s["rollout"] + s["update"]
    return ["step time, estimated from the throughput given (--throughput; plan measures "
            "nothing):",
            f"  rollout {_n(tokens.generated)} generated / {throughput['rollout']:,g} tok/s = "
            f"{s['rollout']:,.1f} s; update {_n(tokens.update)} / {throughput['update']:,g} "
            f"tok/s = {s['update']:,.1f} s",
            f"  = {total:,.1f} s a step, {_duration(total * steps)} for trainer.total_steps="
            f"{steps} (the judge, RUR, weight sync and the controller not included)"]


def render_update_time(tokens: int, throughput: float, steps: int) -> list[str]:
    """A supervised stage's step: its trained tokens at the update throughput given."""
    s = tokens / throughput
    total = (f", {_duration(s * steps)} for trainer.total_steps={steps}" if steps else
             " (trainer.total_steps 0: epochs x the data's batches, which plan does not read)")
    return ["step time, estimated from the throughput given (--throughput; plan measures "
            "nothing):", f"  {_n(tokens)} / {throughput:,g} tok/s = {s:,.1f} s a step{total}"]
