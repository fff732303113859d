"""ESCRAG-R1's Client-Counselor-Judge evaluation and RAG inference: scripted model and judge
answers, the real exemplar index and embedding model for retrieval; figures worked by hand."""
from functools import partial

import pytest

from peer_rl.evaluation.cases import Context, load_contexts
from peer_rl.evaluation.ccj import ccj_case, summarise_ccj
from peer_rl.evaluation.prompts import CCJ_DIMENSIONS
from peer_rl.evaluation.runner import run_all
from peer_rl.evaluation.supporter import supporter_turn

from .scripted import Scripted, last_user

HISTORY = ({"role": "seeker", "content": "My beekeeping club voted me out after I lost all "
                                         "three hives to mites."},)
OWN = "I am sorry the club voted you out; the mites took everything you had built."
CTX = Context("c1", "en", HISTORY)
PLANTED = ("Losing every hive after all that care, and then the club too: no wonder you feel "
           "shut out of something you loved.")


def _judge(request):
    text = last_user(request)
    if "You are the client" in text:
        return ('{"emotional_impact": 7, "non_lecturing_empathy": 9, "therapeutic_alliance": 8, '
                '"reason": "warm"}')
    if "supervisor" in text:
        return "strategic_coherence: 6, and theoretical_application: 12"   # 12 is out of range
    return '{"strategy_client_fit": 5, "problem_targeting": 4, "reason": "generic"}'


def test_ccj_scores_the_shown_reply_from_three_perspectives():
    model = Scripted(lambda r: "<think>Stage: exploration.</think>\nThat is a double loss.")
    judge = Scripted(_judge)
    [rec] = run_all([CTX], partial(ccj_case, style="escrag"), {"model": model, "judge": judge})
    assert rec["reply"] == "That is a double loss." and rec["format_ok"] is True
    assert len(judge.batches) == 1 and len(judge.batches[0]) == 3      # one per perspective
    for req in judge.batches[0]:
        assert "That is a double loss." in last_user(req) and "<think>" not in last_user(req)
        assert set(req.schema["required"]) - {"reason"} <= set(CCJ_DIMENSIONS)
    assert rec["scores"] == {"emotional_impact": 7, "non_lecturing_empathy": 9,
                             "therapeutic_alliance": 8, "strategic_coherence": 6,
                             "theoretical_application": None, "strategy_client_fit": 5,
                             "problem_targeting": 4}
    assert "exemplars" not in rec      # no retrieval without rag_k


def test_ccj_summary_by_hand():
    def rec(i, scores, fmt=True):
        return {"id": str(i), "language": "en", "format_ok": fmt,
                "scores": dict(zip(CCJ_DIMENSIONS, scores))}
    recs = [rec(1, [8, 8, 8, 6, 6, 4, 4]), rec(2, [6, 10, 7, 8, None, 6, 2], fmt=False),
            {"id": "3", "error": "model: refused"}]
    s = summarise_ccj(recs)
    assert s["cases"] == 3 and s["errors"] == 1 and s["error_ids"] == ["3"]
    dims = s["dimensions"]
    assert dims["emotional_impact"]["mean"] == 7.0 and dims["non_lecturing_empathy"]["mean"] == 9.0
    assert dims["theoretical_application"] == {"mean": 6.0, "n": 1, "unparsed": 1}
    assert s["judge_unparsed"] == 1
    # the averages cover context 1 alone (context 2 lacks theoretical_application):
    # client (8 + 8 + 8) / 3, counselor (6 + 6) / 2, judge (4 + 4) / 2
    assert s["perspectives"] == pytest.approx({"client": 8.0, "counselor": 6.0, "judge": 4.0})
    # the headline is the perspectives' mean (8 + 6 + 4) / 3; the seven dimensions' mean is
    # (3 x 8 + 2 x 6 + 2 x 4) / 7 = 44 / 7
    assert s["average"] == pytest.approx(6.0)
    assert s["dimension_average"] == pytest.approx(44 / 7)
    assert s["complete"] == 1 and s["missing"] == {"theoretical_application": 1}
    assert s["format_rate"] == 0.5 and s["rag"] is False


def test_ccj_average_is_missing_when_a_dimension_never_parsed():
    s = summarise_ccj([{"id": "1", "language": "zh", "format_ok": None,
                        "scores": {d: (None if d == "problem_targeting" else 5)
                                   for d in CCJ_DIMENSIONS}}])
    assert s["average"] is None and s["dimension_average"] is None
    assert s["perspectives"] == {"client": None, "counselor": None, "judge": None}
    assert s["dimensions"]["emotional_impact"]["mean"] == 5.0 and s["complete"] == 0


def test_contexts_shared_by_several_pairs_count_once():
    from peer_rl.data.bundled import sample_root

    loaded = load_contexts(sample_root(), "preference", "test")
    # the sample writes two pairs (-a, -b) per test turn
    assert len(loaded.items) == 134 // 2 and not loaded.skipped
    assert all(c.history[-1]["role"] == "seeker" for c in loaded.items)


@pytest.fixture(scope="module")
def planted_index(tmp_path_factory):
    from peer_rl.data.escrag import exemplar_rows
    from peer_rl.data.bundled import targets
    from peer_rl.retrieval.index import build_index
    from peer_rl.models.encoders import MULTILINGUAL_USE, load_embedding_model

    # the planted exemplar answers another conversation about the same loss; one with this
    # very dialogue's history is never returned for it (peer_rl.retrieval.index.same_dialogue)
    other = [{"role": "seeker", "content": "The beekeepers' club kicked me out once mites took "
                                           "every one of my hives."}]
    corpus = exemplar_rows(targets("en") + targets("zh")) + [
        {"id": "planted", "language": "en", "history": other, "response": PLANTED},
        {"id": "own", "language": "en", "history": list(HISTORY), "response": OWN}]
    out = tmp_path_factory.mktemp("rag") / "index"
    build_index(corpus, load_embedding_model(MULTILINGUAL_USE).encode, MULTILINGUAL_USE, out)
    return out


@pytest.mark.e2e   # loads the real multilingual sentence encoder
def test_rag_inference_writes_the_final_reply_from_the_initial_one_and_retrieved_exemplars(
        planted_index):
    from peer_rl.evaluation.retriever import LocalRetriever

    def answer(r):
        if "Your initial response" in last_user(r):
            return "<think>The guidelines help.</think>\nFinal: losing the hives and the club."
        return "<think>draft</think>\nI'm sorry the club voted you out after the mites."
    model = Scripted(answer)
    retriever = LocalRetriever(planted_index)

    def program(case):
        turns = yield from supporter_turn("escrag", list(HISTORY), "en", n=2, rag_k=2)
        return {"turns": turns}

    [rec] = run_all([CTX], program, {"model": model, "retrieval": retriever})
    turns = rec["turns"]
    assert [len(b) for b in model.batches] == [1, 2]   # pass 1 (n=2), then one final per draft
    final_prompt = last_user(model.batches[1][0])
    assert "I'm sorry the club voted you out after the mites." in final_prompt
    assert f"1. {PLANTED}" in final_prompt            # the planted exemplar is retrieved first
    for t in turns:
        assert t.shown == "Final: losing the hives and the club." and t.format_ok is True
        assert len(t.exemplars) == 2 and t.exemplars[0] == PLANTED and OWN not in t.exemplars
        assert t.initial_raw.startswith("<think>draft</think>")
    assert retriever.excluded >= 2                     # "own", passed over for both drafts


def test_rag_needs_the_escrag_prompt():
    from peer_rl.config.schema import ConfigError
    from peer_rl.evaluation.config import load_eval_config

    with pytest.raises(ConfigError, match=r"rag.index='/x': RAG inference is ESCRAG-R1's "
                                          r"two-pass prompt; set model.prompt=escrag"):
        load_eval_config("ccj", ["model.url=http://h/v1", "judge.url=http://h/v1",
                                 "rag.index=/x"])
    with pytest.raises(ValueError, match="RAG inference needs the escrag prompt"):
        next(supporter_turn("peer", list(HISTORY), "en", rag_k=2))   # before any request
