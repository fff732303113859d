"""SeekerWorker on a real (tiny, random) vLLM engine: the analyser's answer follows its JSON
schema, and greedy answers depend on the request alone, not on what else is in the batch (so
any number of seeker workers gives the same dialogues)."""
import pytest

from peer_rl.config.worker_settings import SeekerSettings
from peer_rl.prompts.answers import parse_int
from peer_rl.prompts.seeker import CHANGE_SCHEMA, sage_analyse_messages, sage_reply_messages
from peer_rl.protocol import SeekerRequest
from peer_rl.workers.seeker import SeekerWorker

HISTORY = [{"role": "seeker", "content": "I failed my exam again."},
           {"role": "supporter", "content": "That sounds really hard. What happened?"}]


@pytest.fixture(scope="module")
def seeker(tiny_models):
    worker = SeekerWorker(tiny_models["policy"], SeekerSettings(
        kv_cache_gib=0.25, max_model_len=1024, temperature=0.0, max_tokens=24))
    yield worker
    worker.close()


@pytest.mark.e2e     # a vLLM engine
def test_the_analyser_answers_its_schema_and_greedy_answers_ignore_the_batch(seeker):
    analyse = SeekerRequest(sage_analyse_messages("You are Ann.", HISTORY, 40, "en"),
                            CHANGE_SCHEMA)
    reply = SeekerRequest(sage_reply_messages("You are Ann.", HISTORY, 42, "a bit better", "en"))
    other = SeekerRequest(sage_reply_messages("You are Bo.", HISTORY[:1], 40, "lost", "en"))
    together = seeker.chat([analyse, reply, other])
    # a random model, held to the schema: its change first, an integer in range, which reads
    # even where max_tokens cuts the reaction short
    answer = together[0]
    assert answer.startswith('{"change":'), answer
    assert parse_int(answer, "change", -10, 10) is not None, answer
    # each alone, in another order: the same text (so sharding over workers changes nothing)
    assert seeker.chat([other])[0] == together[2]
    assert seeker.chat([reply, analyse]) == [together[1], together[0]]
    assert seeker.health()["answered"] == 6
