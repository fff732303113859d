"""PEER's reward (UnifiReward's four rounds, PEER-RUR's reweighting) as a verl reward manager.

verl 0.9.1's reward loop calls `run_single` once per sample, on whichever reward-loop worker got
it; in its default V1 trainer every sample is streamed from the agent loop that generated it, so
no call ever holds a whole group. RUR needs the group's other replies, so each call joins a group
barrier (`GroupBarrier`, one named Ray actor per job; in-process when Ray is not running) that
collects the replies of a `uid` and answers every member once the group is whole.

What verl passes a sample, and so what the barrier knows (docs/verl.md, "What the plug-in
sees"): the row's columns, `uid` and, from V1's agent loop, `session_id`; no `meta_info`, so
neither `validate` nor the group size. A group's size is therefore `group_size` when set, else
`rollout.val_kwargs.n` when verl marks the batch `meta_info["validate"]` (its batch path) or the
row's `extra_info.split` is not "train" (`peer-rl data to-verl` writes train / val / test), else
`rollout.n`. A group of one closes at once. A group whose next reply has not come
`group_timeout_s` after its latest (a rollout that failed before scoring) is scored with the
replies that came, RUR's in-group similarity over those, and logged.

Use (verl config):
    reward.reward_manager.source=importlib
    reward.reward_manager.module.path=pkg://peer_rl.integrations.verl_reward
    reward.reward_manager.name=PeerRewardManager
    +reward.reward_kwargs.judge_path=/path/to/judge   (its judge_template.json and tokenizer)
    +reward.reward_kwargs.judge_url=http://127.0.0.1:8000/v1   (or verl's own reward model)
    (the other keys: peer_rl.integrations.verl_settings.PeerRewardSettings)

Defined behaviour: a response without the four steps is judged as peer-rl judges it (format 0,
missing steps not asked, the raw text as the reply); an unparseable verdict scores 0 and counts
in judge/parse_failures; a judge that gives no usable answer (unreachable, 5xx, a malformed 200)
raises JudgeUnreachable after `retries` attempts (a silent 0 would train on a wrong reward); an
incomplete group is answered as above (rur/group_complete 0, a warning names the uid); a group
of one has s_group 0.
"""
from __future__ import annotations

import asyncio
import logging
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field

from omegaconf import OmegaConf
from verl import DataProto
from verl.experimental.reward_loop.reward_manager import register
from verl.experimental.reward_loop.reward_manager.base import RewardManagerBase

from peer_rl.integrations.judge_http import HttpJudge, JudgeUnreachable  # noqa: F401
from peer_rl.prompts.judge import JudgeTemplate
from peer_rl.prompts.judge_rounds import JudgeRounds, candidate_coin, judge_result
from peer_rl.protocol import JudgeItem
from peer_rl.prompts.reasoning import parse_structured
from peer_rl.algos.rewards import rur_reweight
from peer_rl.config.worker_settings import RedundancySettings
from peer_rl.integrations.verl_settings import PeerRewardSettings

logger = logging.getLogger(__name__)

BARRIER_NAME = "peer_rl_rur_groups"


@dataclass
class _Group:
    size: int
    history: list[str]
    latest: float                                                  # its latest reply's time
    members: list[tuple[str, str]] = field(default_factory=list)   # (member id, reply)
    done: asyncio.Event = field(default_factory=asyncio.Event)
    results: dict[str, dict] = field(default_factory=dict)        # member id -> similarities
    by_reply: dict[str, dict] = field(default_factory=dict)


class GroupBarrier:
    """Collects each group's replies and answers its members once the group is whole, or once
    `timeout_s` (the joining manager's `group_timeout_s`) has passed since its latest reply (a
    sibling rollout that failed never comes).

    A member arriving after its group closed (a slow sibling, or a copy from verl's batch
    padding) gets the answer of the member with the same reply, or is scored against the closed
    group's replies. Closed groups are kept (oldest dropped first) for such late members.
    """

    def __init__(self, settings: RedundancySettings, keep_groups: int = 100_000):
        # deferred: tests patch RedundancyWorker
        from peer_rl.workers.redundancy import RedundancyWorker

        self.worker = RedundancyWorker(settings, device="cpu")
        self.keep_groups = keep_groups
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

    async def _wait(self, uid: str, g: _Group, timeout_s: float) -> None:
        """Until the group closes; closes it when no reply came for `timeout_s`."""
        loop = asyncio.get_running_loop()
        while not g.done.is_set():
            left = g.latest + timeout_s - loop.time()
            if left <= 0:
                logger.warning("RUR group uid=%s: %d of %d replies, none for %.0f s "
                               "(group_timeout_s); scored with the replies that came", uid,
                               len(g.members), g.size, timeout_s)
                self._close(g)
                return
            try:
                await asyncio.wait_for(g.done.wait(), left)
            except asyncio.TimeoutError:
                pass

    async def join(self, uid: str, member: str, reply: str, history: list[str], size: int,
                   timeout_s: float) -> dict:
        """s_hist, s_group, tau of `reply` among its group `uid` of `size` members."""
        now = asyncio.get_running_loop().time()
        g = self.groups.get(uid)
        if g is None:
            g = self.groups[uid] = _Group(size=size, history=list(history), latest=now)
        if g.done.is_set():
            return self._late(g, reply)
        g.members.append((member, reply))
        g.latest = now
        if len(g.members) >= g.size:
            self._close(g)
        else:
            await self._wait(uid, g, timeout_s)
        return g.results[member]


def _barrier(settings: PeerRewardSettings):
    """The job's barrier: one named Ray actor shared by every reward-loop worker, or a local one
    where Ray is not running (a single process sees every sample)."""
    import ray  # deferred: ray (~1 s); commands that start no cluster run without it

    if not ray.is_initialized():
        return _LocalBarrier(GroupBarrier(settings.redundancy))
    actor = ray.remote(GroupBarrier).options(name=BARRIER_NAME, get_if_exists=True,
                                             num_cpus=0, max_concurrency=10_000)
    return _RemoteBarrier(actor.remote(settings.redundancy))


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


def check_reward_path(config, rur: bool) -> None:
    """Refuse, at start-up, the verl paths on which the manager cannot score right.

    verl scores on one of two paths: streamed from the agent loop (no reward model, or one in
    its own resource pool), each sample alone with its row and `uid`; or, when it serves
    a reward model on the trainer's GPUs, in a batch after rollout. V1's batch
    (`_compute_reward_colocate`) carries only the prompt and response, no `uid`, history or
    reference. The legacy trainer's batch carries them but is padded with copies of its first
    samples to a multiple of `reward.num_workers`, copies a group would count as members.
    """
    rm = OmegaConf.select(config, "reward.reward_model", default=None) or {}
    if rm.get("enable", False) and not OmegaConf.select(
            config, "reward.custom_reward_function.path", default=None):
        raise ValueError(
            "reward.reward_model.enable=True without reward.custom_reward_function.path: verl "
            "then scores with its discriminative reward-model path, not this manager; set "
            "reward.custom_reward_function.path=pkg://peer_rl.integrations.verl_reward")
    if not rm.get("enable", False) or rm.get("enable_resource_pool", False):
        return                                  # streamed from the agent loop: nothing padded
    if OmegaConf.select(config, "trainer.use_v1", default=True):
        raise ValueError(
            "reward.reward_model.enable=True without reward.reward_model.enable_resource_pool: "
            "verl's V1 trainer then scores a batch that carries no uid, history or reference; "
            "set reward.reward_model.enable_resource_pool=True (with "
            "reward.reward_model.n_gpus_per_node and nnodes for the judge) or serve the judge "
            "yourself (reward.reward_kwargs.judge_url)")
    batch = OmegaConf.select(config, "data.train_batch_size", default=None)
    n = OmegaConf.select(config, "actor_rollout_ref.rollout.n", default=1)
    workers = OmegaConf.select(config, "reward.num_workers", default=None)
    if rur and batch and workers and (batch * n) % workers:
        raise ValueError(
            f"reward.num_workers={workers} does not divide data.train_batch_size x rollout.n = "
            f"{batch * n}: verl's legacy trainer (trainer.use_v1=False) pads the batch it scores "
            "with copies of its first samples, which RUR's groups would count as members; "
            "choose a divisor")


@register("peer")
class PeerRewardManager(RewardManagerBase):
    """PEER / PEER-RUR rewards for verl's reward loop (one sample per `run_single`)."""

    def __init__(self, config, tokenizer, compute_score=None, reward_router_address=None,
                 reward_model_tokenizer=None):
        from transformers import AutoTokenizer  # deferred: transformers (~3 s, pulls in torch)

        super().__init__(config, tokenizer, compute_score)
        s = self.settings = PeerRewardSettings.from_verl(config)
        check_reward_path(config, s.rur)
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

    def group_size(self, data: DataProto, row: dict) -> int:
        """How many samples of this sample's `uid` verl makes: `group_size` when set, else
        val_kwargs.n for validation (verl's `meta_info["validate"]` where it passes one, else
        the row's `extra_info.split` other than "train"), else rollout.n."""
        if self.settings.group_size is not None:
            return self.settings.group_size
        validate = data.meta_info.get("validate")
        if validate is None:
            extra = row.get("extra_info")
            split = extra.get("split") if isinstance(extra, dict) else None
            validate = split is not None and split != "train"
        return int(self.n_val if validate else self.n_train)

    async def run_single(self, data: DataProto) -> dict:
        uid, text, row = self._decode(data)
        history = list(_field(row, "extra_info", "history", uid))
        parsed = parse_structured(text)
        reply = parsed.reply
        item = JudgeItem(history=[dict(u) for u in history],
                         lang=_field(row, "extra_info", "language", uid),
                         steps=[parsed.steps.get(j) or None for j in (1, 2, 3)], reply=reply,
                         reference=_field(row, "reward_model", "ground_truth", uid),
                         candidate_first=candidate_coin(self.settings.seed, uid, text),
                         format_complete=parsed.complete)
        result = judge_result(item, await self._answers(item), self.settings.weights)
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
                                           self.group_size(data, row),
                                           self.settings.group_timeout_s)
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
