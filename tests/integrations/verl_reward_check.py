"""Runs in .venv-verl (verl 0.9.1): the PEER reward manager as verl runs it, for
tests/integrations/test_verl_reward.py, which compares the figures with peer-rl's own scoring.

argv: the cases JSON the test wrote, the report JSON to write. The config is composed from
examples/verl/peer_rur.yaml as `python -m verl.trainer.main_ppo` composes it and checked with
verl's validate_config; the batch is a DataProto laid out as verl's rollout lays it out (left-
padded prompts, right-padded responses ending in EOS, `uid` per prompt repeated n times); the
main figures come from verl's own RewardLoopManager (two Ray reward-loop workers; their
contiguous chunks of 6 split the middle group between them).
"""
import asyncio
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from transformers import AutoTokenizer

from verl import DataProto
from verl.trainer.ppo.reward import load_reward_manager
from verl.trainer.ppo.utils import need_critic, need_reference_policy
from verl.utils.config import validate_config

REPO = Path(__file__).resolve().parents[2]


def config(case: dict, *overrides: str):
    with initialize_config_dir(config_dir=str(REPO / "examples" / "verl"), version_base=None):
        cfg = compose("peer_rur", overrides=[
            f"actor_rollout_ref.model.path={case['policy']}",
            f"reward.reward_kwargs.judge_path={case['judge']}",
            f"reward.reward_kwargs.judge_url={case['judge_url']}",
            "trainer.n_gpus_per_node=1", "data.train_batch_size=3", "reward.num_workers=2",
            "actor_rollout_ref.actor.ppo_mini_batch_size=3",
            *overrides])
    validate_config(cfg, use_reference_policy=need_reference_policy(cfg),
                    use_critic=need_critic(cfg))
    return cfg


def batch(tok, groups: list[dict], n: int) -> DataProto:
    """Prompts x n responses as verl's rollout returns them."""
    prompts, responses, rows = [], [], []
    for g in groups:
        ids = tok.apply_chat_template(g["row"]["messages"], add_generation_prompt=True,
                                      tokenize=True, return_dict=False)
        for text in g["responses"][:n]:
            prompts.append(list(ids))
            responses.append(tok.encode(text, add_special_tokens=False) + [tok.eos_token_id])
            rows.append(g)
    p_len, r_len = max(map(len, prompts)), max(map(len, responses))
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    prompt_ids = torch.tensor([[pad] * (p_len - len(p)) + p for p in prompts])
    prompt_mask = torch.tensor([[0] * (p_len - len(p)) + [1] * len(p) for p in prompts])
    resp_ids = torch.tensor([r + [pad] * (r_len - len(r)) for r in responses])
    resp_mask = torch.tensor([[1] * len(r) + [0] * (r_len - len(r)) for r in responses])
    mask = torch.cat([prompt_mask, resp_mask], dim=1)
    obj = lambda xs: np.array(xs, dtype=object)   # noqa: E731
    return DataProto.from_dict(
        tensors={"prompts": prompt_ids, "responses": resp_ids,
                 "input_ids": torch.cat([prompt_ids, resp_ids], dim=1), "attention_mask": mask,
                 "position_ids": torch.clamp(mask.cumsum(-1) - 1, min=0)},
        non_tensors={"uid": obj([g["uid"] for g in rows]),
                     "data_source": obj(["peer_rl/test"] * len(rows)),
                     "raw_prompt": obj([g["row"]["messages"] for g in rows]),
                     "reward_model": obj([{"style": "model", "ground_truth": g["row"]["solution"]}
                                          for g in rows]),
                     "extra_info": obj([{"history": g["row"]["history"],
                                         "language": g["row"]["language"]} for g in rows])})


def decoded(tok, data: DataProto) -> list[str]:
    out = []
    for i in range(len(data)):
        ids = data.batch["responses"][i]
        n = int(data.batch["attention_mask"][i, -ids.shape[-1]:].sum())
        out.append(tok.decode(ids[:n], skip_special_tokens=True))
    return out


def with_verl_workers(cfg, data: DataProto) -> dict:
    import ray
    from verl.experimental.reward_loop.reward_loop import RewardLoopManager

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        out = RewardLoopManager(cfg).compute_rm_score(data)
    finally:
        ray.shutdown()
    n_valid = data.batch["attention_mask"][:, data.batch["prompts"].shape[1]:].sum(-1)
    scores = out.batch["rm_scores"]
    return {"rewards": [float(scores[i, n_valid[i] - 1]) for i in range(len(data))],
            "nonzero_per_row": [int((scores[i] != 0).sum()) for i in range(len(data))],
            "extra": {k: [float(x) for x in v] for k, v in out.non_tensor_batch.items()},
            "extra_keys": out.meta_info["reward_extra_keys"]}


async def timed(coro_fn) -> dict:
    t = time.perf_counter()
    try:
        value = await coro_fn()
        return {"ok": True, "value": value, "seconds": time.perf_counter() - t}
    except Exception as exc:  # the report carries the error for the test to judge
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}",
                "seconds": time.perf_counter() - t}


def _without_history(one: DataProto) -> DataProto:
    one.non_tensor_batch["extra_info"] = np.array([{"language": "en"}], dtype=object)
    return one


async def behaviours(case: dict, tok, data: DataProto) -> dict:
    """Defined behaviour in one process (no Ray: the in-process barrier)."""
    def manager(*overrides):
        return load_reward_manager(config(case, *overrides), tok)

    out = {}
    m = manager(f"reward.reward_kwargs.judge_url=http://127.0.0.1:{case['closed_port']}/v1",
                "+reward.reward_kwargs.retries=2", "+reward.reward_kwargs.request_timeout_s=5")
    out["unreachable"] = await timed(lambda: m.run_single(data[0:1]))
    m = manager("+reward.reward_kwargs.group_timeout_s=3")
    out["incomplete"] = await timed(lambda: asyncio.gather(
        *(m.run_single(data[i:i + 1]) for i in range(3))))
    out["late"] = await timed(lambda: m.run_single(data[3:4]))   # the 4th, after the close
    out["late_copy"] = await timed(lambda: m.run_single(data[0:1]))   # a copy of a member
    m = manager("actor_rollout_ref.rollout.n=1", "reward.num_workers=1")
    one = data[4:5]
    out["group_of_one"] = await timed(lambda: m.run_single(one))
    m = manager()
    val = data[0:1]
    val.meta_info = {**val.meta_info, "validate": True}     # val_kwargs.n = 1 by default
    out["validation"] = await timed(lambda: m.run_single(val))
    no_uid = data[0:1]
    no_uid.non_tensor_batch.pop("uid")
    out["no_uid"] = await timed(lambda: m.run_single(no_uid))
    out["no_history"] = await timed(lambda: m.run_single(_without_history(data[0:1])))
    out["bad_key"] = await timed(lambda: asyncio.to_thread(
        manager, "+reward.reward_kwargs.judge_pth=/x"))
    out["num_workers"] = await timed(lambda: asyncio.to_thread(manager, "reward.num_workers=5"))
    out["rur_off"] = await timed(lambda: manager("reward.reward_kwargs.rur=false")
                                 .run_single(data[0:1]))
    return out


def main(cases_path: str, report_path: str) -> None:
    case = json.loads(Path(cases_path).read_text())
    tok = AutoTokenizer.from_pretrained(case["policy"])
    cfg = config(case)
    data = batch(tok, case["groups"], cfg.actor_rollout_ref.rollout.n)
    report = {"decoded": decoded(tok, data), "uids": [str(u) for u in data.non_tensor_batch["uid"]],
              "verl": with_verl_workers(cfg, data),
              "behaviours": asyncio.run(behaviours(case, tok, data))}
    Path(report_path).write_text(json.dumps(report, default=str))


if __name__ == "__main__":
    main(*sys.argv[1:3])
