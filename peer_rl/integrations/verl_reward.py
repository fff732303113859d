"""PEER's reward (UnifiReward's four rounds, PEER-RUR's reweighting) as a verl reward manager.

verl 0.9.1's reward loop calls `run_single` once per sample, on whichever reward-loop worker got
it (a contiguous chunk of the batch, or one sample streamed from an agent loop), so no call ever
holds a whole group. RUR needs the group's other replies, so each call joins a group barrier
(`GroupBarrier`, one named Ray actor per job; in-process when Ray is not running) that collects
the replies of a `uid` and answers every member once the group is whole. This holds under both of
verl's schedules; the alternative, a custom trainer reweighting in `_compute_advantage`, would
tie the plug-in to verl's trainer internals, which change between releases.

Use (verl config):
    reward.reward_manager.source=importlib
    reward.reward_manager.module.path=pkg://peer_rl.integrations.verl_reward
    reward.reward_manager.name=PeerRewardManager
    +reward.reward_kwargs.judge_path=/path/to/judge   (its judge_template.json and tokenizer)
    +reward.reward_kwargs.judge_url=http://127.0.0.1:8000/v1   (or verl's own reward model)

Defined behaviour: a response without the four steps is judged as peer-rl judges it (format 0,
missing steps not asked, the raw text as the reply); an unparseable verdict scores 0 and counts
in judge/parse_failures; a judge that gives no usable answer (unreachable, 5xx, a malformed 200)
raises JudgeUnreachable after `retries` attempts (a silent 0 would train on a wrong reward); a
group that never completes is answered after `group_timeout_s` from the members that came
(rur/group_complete 0, a warning names the uid); a group of one has s_group 0.
"""
from __future__ import annotations

import asyncio
import logging
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field

from omegaconf import MISSING, OmegaConf
from verl import DataProto
from verl.experimental.reward_loop.reward_manager import register
from verl.experimental.reward_loop.reward_manager.base import RewardManagerBase

from peer_rl.integrations.judge_http import HttpJudge, JudgeUnreachable  # noqa: F401
from peer_rl.prompts.judge import JudgeTemplate
from peer_rl.prompts.judge_rounds import JudgeRounds, candidate_coin, judge_result
from peer_rl.protocol import JudgeItem
from peer_rl.reasoning import parse_structured
from peer_rl.rewards import rur_reweight
from peer_rl.worker_settings import JudgeSettings, RedundancySettings

logger = logging.getLogger(__name__)

BARRIER_NAME = "peer_rl_rur_groups"


@dataclass
class PeerRewardSettings:
    """`reward.reward_kwargs` of a verl config (a misspelt key fails at start-up, named)."""
    judge_path: str = MISSING            # the judge directory: judge_template.json, tokenizer
    judge_url: str | None = None         # OpenAI-compatible base URL; None: verl's reward model
    judge_model: str | None = None       # served name; None: the server's only model
    max_model_len: int | None = None     # judge context; None: the server's (/v1/models)
    max_tokens: int = JudgeSettings.max_tokens
    request_timeout_s: float = 120.0
    retries: int = 3                     # attempts per judge request before JudgeUnreachable
    seed: int = 0                        # the candidate-position coin
    rur: bool = True                     # PEER-RUR; false: PEER
    group_size: int | None = None        # None: rollout.n (val_kwargs.n when validating)
    group_timeout_s: float = 600.0
    redundancy: RedundancySettings = field(default_factory=RedundancySettings)

    @classmethod
    def from_verl(cls, config) -> "PeerRewardSettings":
        kwargs = OmegaConf.select(config, "reward.reward_kwargs", default=None)
        if kwargs is None:
            raise ValueError("reward.reward_kwargs is not set: the PEER reward manager needs at "
                             "least +reward.reward_kwargs.judge_path=<judge directory>")
        try:
            merged = OmegaConf.merge(OmegaConf.structured(cls), kwargs)
            return OmegaConf.to_object(merged)
        except Exception as exc:     # omegaconf names the key and the expected type
            raise ValueError(f"reward.reward_kwargs: {exc}") from exc


@dataclass
class _Group:
    size: int
    history: list[str]
    members: list[tuple[str, str]] = field(default_factory=list)   # (member id, reply)
    done: asyncio.Event = field(default_factory=asyncio.Event)
    results: dict[str, dict] = field(default_factory=dict)        # member id -> similarities
    by_reply: dict[str, dict] = field(default_factory=dict)


class GroupBarrier:
    """Collects each group's replies and answers its members once the group is whole.

    A member arriving after its group closed (verl pads a batch with copies of its first
    samples) gets the answer of the member with the same reply, or is scored against the closed
    group's replies. Closed groups are kept (oldest dropped first) for such late copies.
    """

    def __init__(self, settings: RedundancySettings, timeout_s: float = 600.0,
                 keep_groups: int = 100_000):
        from workers.redundancy import RedundancyWorker

        self.worker = RedundancyWorker(settings, device="cpu")
        self.timeout_s, self.keep_groups = timeout_s, keep_groups
        self.groups: OrderedDict[str, _Group] = OrderedDict()

    def _close(self, g: _Group) -> None:
        replies = [r for _, r in g.members]
        sims = self.worker.similarities(replies, [g.history], len(replies))
        for k, (member, reply) in enumerate(g.members):
            g.results[member] = g.by_reply[reply] = {
                "s_hist": float(sims.s_hist[k]), "s_group": float(sims.s_group[k]),
                "tau": float(sims.tau[k]), "members": len(replies),
                "complete": len(replies) == g.size}
        g.done.set()
        while len(self.groups) > self.keep_groups:
            self.groups.popitem(last=False)

    def _late(self, g: _Group, reply: str) -> dict:
        if reply in g.by_reply:
            return g.by_reply[reply]
        replies = [r for _, r in g.members] + [reply]
        sims = self.worker.similarities(replies, [g.history], len(replies))
        return {"s_hist": float(sims.s_hist[-1]), "s_group": float(sims.s_group[-1]),
                "tau": float(sims.tau[-1]), "members": len(replies), "complete": False}

    async def join(self, uid: str, member: str, reply: str, history: list[str],
                   size: int) -> dict:
        """s_hist, s_group, tau of `reply` among its group `uid` of `size` members."""
        g = self.groups.get(uid)
        if g is None:
            g = self.groups[uid] = _Group(size=size, history=list(history))
        if g.done.is_set():
            return self._late(g, reply)
        g.members.append((member, reply))
        if len(g.members) >= g.size:
            self._close(g)
        else:
            try:
                await asyncio.wait_for(g.done.wait(), self.timeout_s)
            except asyncio.TimeoutError:
                if not g.done.is_set():
                    logger.warning("RUR group uid=%s: %d of %d replies after %.0f s; scored "
                                   "with the replies that came", uid, len(g.members), g.size,
                                   self.timeout_s)
                    self._close(g)
        return g.results[member]


def _barrier(settings: PeerRewardSettings):
    """The job's barrier: one named Ray actor shared by every reward-loop worker, or a local one
    where Ray is not running (a single process sees every sample)."""
    import ray

    if not ray.is_initialized():
        return _LocalBarrier(GroupBarrier(settings.redundancy, settings.group_timeout_s))
    actor = ray.remote(GroupBarrier).options(name=BARRIER_NAME, get_if_exists=True,
                                             num_cpus=0, max_concurrency=10_000)
    return _RemoteBarrier(actor.remote(settings.redundancy, settings.group_timeout_s))


class _LocalBarrier:
    def __init__(self, barrier: GroupBarrier):
        self.barrier = barrier

    async def join(self, *args) -> dict:
        return await self.barrier.join(*args)


class _RemoteBarrier:
    def __init__(self, handle):
        self.handle = handle

    async def join(self, *args) -> dict:
        return await self.handle.join.remote(*args)


def _field(row: dict, key: str, sub: str, uid: str):
    value = row.get(key)
    if not isinstance(value, dict) or sub not in value:
        raise ValueError(f"sample uid={uid}: non_tensor_batch[{key!r}] has no {sub!r} (rows for "
                         "the PEER reward are written by `peer-rl data to-verl`)")
    return value[sub]


@register("peer")
class PeerRewardManager(RewardManagerBase):
    """PEER / PEER-RUR rewards for verl's reward loop (one sample per `run_single`)."""

    def __init__(self, config, tokenizer, compute_score=None, reward_router_address=None,
                 reward_model_tokenizer=None):
        from transformers import AutoTokenizer

        super().__init__(config, tokenizer, compute_score)
        s = self.settings = PeerRewardSettings.from_verl(config)
        if s.judge_url is None and reward_router_address is None:
            raise ValueError("no judge: set reward.reward_kwargs.judge_url (an OpenAI-compatible "
                             "server of the judge) or enable verl's reward model "
                             "(reward.reward_model.enable=True, model_path=<judge>)")
        router = s.judge_url is None
        url = f"http://{reward_router_address}/v1" if router else s.judge_url
        model = s.judge_model or (OmegaConf.select(config, "reward.reward_model.model_path")
                                  if router else None)
        self.judge = HttpJudge(url, model, s.request_timeout_s, s.retries)
        self.router_max_model_len = (OmegaConf.select(
            config, "reward.reward_model.rollout.max_model_len") if router else None)
        self.template = JudgeTemplate.load(s.judge_path)
        self.judge_tokenizer = AutoTokenizer.from_pretrained(s.judge_path)
        self.rounds: JudgeRounds | None = None          # needs the context length: first call
        self.n_train = OmegaConf.select(config, "actor_rollout_ref.rollout.n", default=1)
        self.n_val = OmegaConf.select(config, "actor_rollout_ref.rollout.val_kwargs.n",
                                      default=1)
        batch = OmegaConf.select(config, "data.train_batch_size", default=None)
        workers = OmegaConf.select(config, "reward.num_workers", default=None)
        if s.rur and s.group_size is None and batch and workers \
                and (batch * self.n_train) % workers:
            raise ValueError(
                f"reward.num_workers={workers} does not divide data.train_batch_size x "
                f"rollout.n = {batch * self.n_train}: verl pads the batch with copies of its "
                "first samples, which RUR's groups would count as members; choose a divisor")
        self.barrier = _barrier(s) if s.rur else None

    async def _rounds(self) -> JudgeRounds:
        if self.rounds is None:
            n_ctx = self.settings.max_model_len or self.router_max_model_len
            if self.judge.model is None or not n_ctx:
                n_ctx = n_ctx or (await self.judge.served()).get("max_model_len")
            if not n_ctx:
                raise ValueError(f"judge at {self.judge.url} does not report max_model_len: set "
                                 "reward.reward_kwargs.max_model_len to the judge's context")
            self.rounds = JudgeRounds(self.template, self.judge_tokenizer, int(n_ctx),
                                      self.settings.max_tokens)
        return self.rounds

    async def _answers(self, item: JudgeItem) -> list[str | None]:
        rounds = await self._rounds()
        turns = await asyncio.get_running_loop().run_in_executor(None, rounds.turns, item)
        dialogue = rounds.dialogue(item, turns)
        try:
            _, chat = next(dialogue)
            while True:
                _, chat = dialogue.send(await self.judge.answer(chat, self.settings.max_tokens))
        except StopIteration as stop:
            return stop.value

    def _decode(self, data: DataProto) -> tuple[str, str, dict]:
        item = data[-1:][0]     # a multi-turn sample is scored on its last sequence
        response_ids = item.batch["responses"]
        n_valid = int(item.batch["attention_mask"][-response_ids.shape[-1]:].sum())
        text = self.tokenizer.decode(response_ids[:n_valid], skip_special_tokens=True)
        if "uid" not in item.non_tensor_batch:
            raise ValueError("a sample without non_tensor_batch['uid']: the PEER reward groups "
                             "replies by the prompt id verl's trainer assigns")
        return str(item.non_tensor_batch["uid"]), text, item.non_tensor_batch

    def group_size(self, data: DataProto) -> int:
        if self.settings.group_size is not None:
            return self.settings.group_size
        return int(self.n_val if data.meta_info.get("validate") else self.n_train)

    async def run_single(self, data: DataProto) -> dict:
        uid, text, row = self._decode(data)
        history = list(_field(row, "extra_info", "history", uid))
        parsed = parse_structured(text)
        reply = parsed.reply(text)
        item = JudgeItem(history=[dict(u) for u in history],
                         lang=_field(row, "extra_info", "language", uid),
                         steps=[parsed.steps.get(j) or None for j in (1, 2, 3)], reply=reply,
                         reference=_field(row, "reward_model", "ground_truth", uid),
                         candidate_first=candidate_coin(self.settings.seed, uid, text),
                         format_complete=parsed.complete)
        result = judge_result(item, await self._answers(item))
        info = {"reward/peer": result.reward, "reward/format": float(parsed.complete),
                **{f"reward/step{k}_true": float(v is True)
                   for k, v in enumerate(result.step_verdicts, start=1)},
                "reward/preference_ok": float(result.preference_ok is True),
                "reward/candidate_first": float(item.candidate_first),
                "judge/parse_failures": float(result.parse_failures),
                "judge/asked": float(result.asked)}
        score = result.reward
        if self.barrier is not None:
            sims = await self.barrier.join(uid, uuid.uuid4().hex, reply,
                                           [u["content"] for u in item.history],
                                           self.group_size(data))
            score = float(rur_reweight([result.reward], [sims["s_hist"]], [sims["s_group"]],
                                       [sims["tau"]])[0])
            info |= {"rur/s_hist": sims["s_hist"], "rur/s_group": sims["s_group"],
                     "rur/tau": sims["tau"], "rur/group_members": float(sims["members"]),
                     "rur/group_complete": float(sims["complete"])}
        return {"reward_score": score, "reward_extra_info": info}


def compute_score(*args, **kwargs):
    """Named by `reward.custom_reward_function` when verl serves the judge: verl's reward loop
    then routes samples to the reward manager (instead of its discriminative-model path); the
    manager scores, so this function is never called."""
    raise RuntimeError("the PEER reward is computed by PeerRewardManager "
                       "(reward.reward_manager.name=PeerRewardManager), not by compute_score")
