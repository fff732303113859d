"""On the bundled sample, no textual GRPO prompt is handed the alternative reply written for its
own turn, whatever data.max_history_turns cuts: the queries are built as ESCRAG-R1 builds them
(peer_rl.methods.escrag_r1.retrieval_queries), answered by the retrieval worker over an index of
the sample's exemplars with k = every exemplar, so an exemplar not excluded is returned. A
prompt's own alternative is found independently: the exemplar whose history is the prompt's
whole history in the files, read with json."""
import json

import pytest

from peer_rl.config.schema import load_config
from peer_rl.data.bundled import sample_root
from peer_rl.models.encoders import MULTILINGUAL_USE, load_embedding_model
from peer_rl.methods.escrag_r1 import retrieval_queries
from peer_rl.protocol import RetrievalQuery, Sample
from peer_rl.prompts.escrag import Reasoned
from peer_rl.retrieval.corpus import load_exemplars
from peer_rl.retrieval.index import build_index
from peer_rl.trainer.run import load_prompts
from peer_rl.workers.retrieval import RetrievalWorker

pytestmark = pytest.mark.e2e   # loads the real multilingual sentence encoder


def _turns(history) -> tuple:
    return tuple((t["role"], t["content"]) for t in history)


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    rows, _ = load_exemplars(sample_root())
    out = tmp_path_factory.mktemp("own_turn") / "index"
    build_index(rows, load_embedding_model(MULTILINGUAL_USE).encode, MULTILINGUAL_USE, out)
    return RetrievalWorker(str(out), MULTILINGUAL_USE, device="cpu")


@pytest.fixture(scope="module")
def own_alternative() -> dict[str, str]:
    """grpo/textual.jsonl's `file:line` id -> the id of the exemplar written for that turn."""
    exemplars = [json.loads(x) for x in
                 (sample_root() / "exemplars" / "exemplars.jsonl").read_text().splitlines()]
    by_history = {_turns(e["history"]): e["id"] for e in exemplars}
    out = {}
    for line, text in enumerate((sample_root() / "grpo" / "textual.jsonl").read_text()
                                .splitlines(), start=1):
        row = json.loads(text)
        if _turns(row["history"]) in by_history:
            out[f"grpo/textual.jsonl:{line}"] = by_history[_turns(row["history"])]
    return out


def _search(worker, queries):
    return worker.search(queries, len(worker.index.exemplars))


def _returned(rows, hits, own) -> list[str]:
    return [r["id"] for r, found in zip(rows, hits.hits)
            if own.get(r["id"]) in {h["id"] for h in found}]


@pytest.mark.parametrize("k", [0, 2, 8])
def test_no_prompt_retrieves_its_own_turns_alternative(worker, own_alternative, k):
    rows = load_prompts(load_config(["data.train_files=[grpo/textual.jsonl]",
                                     f"data.max_history_turns={k}"]))
    assert len(rows) == 152 and len(own_alternative) == 152   # every prompt has one
    initial = [Sample(uid=i, prompt_ids=[], response_ids=[], response_logprobs=[], text="")
               for i in range(len(rows))]
    parsed = [Reasoned(reasoning="", reply=r["solution"], complete=True) for r in rows]
    hits = _search(worker, retrieval_queries(rows, initial, parsed))
    assert _returned(rows, hits, own_alternative) == []
    assert all(n >= 1 for n in hits.excluded)          # each passed over at least its own turn
    assert all(len(h) == len(worker.index.exemplars) - n
               for h, n in zip(hits.hits, hits.excluded))
    if k:
        # negative control: the same queries without the dialogue's identity (the cut history
        # alone) do hand the long prompts their own turn's alternative
        bare = _search(worker, [RetrievalQuery(r["history"], r["solution"]) for r in rows])
        leaked = _returned(rows, bare, own_alternative)
        assert len(leaked) == sum(len(r["dialogue_history"]) > k for r in rows) > 0
