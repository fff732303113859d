"""The in-training evaluation's figures are worked out from what the pools answer: a rollout pool
and a judge pool whose answers the test writes (the WorkerGroup.call interface the controller
hands it), and every expected figure counted by hand from those answers."""
import numpy as np
import pytest

from peer_rl.config.schema import load_config
from peer_rl.evaluation.in_training import InTrainingEval
from peer_rl.protocol import Sample

# prompt 0 and prompt 1 each answered twice (eval.n=2), in the four-step format
REPLIES = {0: ["you are not alone", "you are brave"], 1: ["you are not alone", "call me"]}


def _structured(reply: str) -> str:
    return f"Step 1: a\nStep 2: b\nStep 3: c\nStep 4: {reply}"


class ScriptedPool:
    """A worker group whose answers the test writes; records the methods it was called with."""

    def __init__(self, answer):
        self.answer, self.calls = answer, []

    def call(self, method, items, *args, step=None):
        self.calls.append((method, len(items)))
        return self.answer(method, items, *args)


def _rollout(method, prompts, sampling):
    """Diversity asks n=2 replies to each prompt (REPLIES, by the prompts' order), safety one."""
    assert method == "generate"
    order = {p.uid: k for k, p in enumerate(sorted(prompts, key=lambda p: p.uid))}
    texts = {p.uid: REPLIES[order[p.uid]] if sampling.n == 2 else ["a safe answer"]
             for p in prompts}
    return [Sample(uid=p.uid, prompt_ids=[], response_ids=[], response_logprobs=[],
                   text=_structured(t)) for p in prompts for t in texts[p.uid]]


class OneHot:
    """encode(): each distinct text its own unit axis (equal texts -> cosine 1, others 0)."""

    def __init__(self):
        self.axes: dict[str, int] = {}

    def __call__(self, texts):
        for t in texts:
            self.axes.setdefault(t, len(self.axes))
        out = np.zeros((len(texts), 256))
        out[np.arange(len(texts)), [self.axes[t] for t in texts]] = 1.0
        return out


def test_the_figures_are_those_of_the_pools_answers():
    cfg = load_config(["eval.diversity_prompts=2", "eval.n=2", "eval.safety_probes=2"])
    ev = InTrainingEval(cfg)
    assert len(ev.prompts) == 2 and len(ev.probes) == 2
    passing = ev.probes[0].history[-1].splitlines()[0][:30]   # the judge passes this probe only
    assert passing not in "".join(ev.probes[1].history)

    def judge(method, convs, *args):
        assert method == "chat"
        return ['{"verdict": "PASS"}' if any(passing in str(m["content"]) for m in c)
                else '{"verdict": "FAIL"}' for c in convs]

    rollout, judges = ScriptedPool(_rollout), ScriptedPool(judge)
    out = ev.run(rollout, judges, OneHot(), step=2)

    assert out["eval/errors"] == 0
    # 13 words, 7 distinct (you are not alone brave call me); 9 bigrams, 5 distinct
    assert out["eval/diversity/distinct_1"] == pytest.approx(7 / 13)
    assert out["eval/diversity/distinct_2"] == pytest.approx(5 / 9)
    # cross-prompt pairs (ordered): 8, of which the two "you are not alone" pairs are equal
    assert out["eval/diversity/self_similarity"] == pytest.approx(2 / 8)
    # prompt 0's two replies differ, prompt 1's too: within-prompt similarity 0
    assert out["eval/diversity/within_prompt_similarity"] == pytest.approx(0.0)
    assert out["eval/diversity/format_rate"] == 1.0
    # one probe of two passed; each group's rate is its one probe's verdict
    assert out["eval/safety/pass_rate"] == 0.5 and out["eval/safety/unparsed"] == 0
    groups = {p.group: float(p is ev.probes[0]) for p in ev.probes}
    for group, rate in groups.items():
        assert out[f"eval/safety/{group}_pass_rate"] == rate, group
    assert rollout.calls == [("generate", 2), ("generate", 2)] and judges.calls == [("chat", 2)]
