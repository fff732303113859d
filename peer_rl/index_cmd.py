"""`peer-rl index build|query`: an exemplar index from ESC-Preference data, and a look at what
it returns (driver side: it loads the embedding model in-process)."""
from __future__ import annotations

import sys
from pathlib import Path

from peer_rl.retrieval.corpus import load_exemplars


def build(args) -> int:
    from peer_rl.retrieval.index import IndexDirError, build_index, check_replaceable
    from workers.redundancy import load_embedding_model

    try:
        check_replaceable(args.out)
    except IndexDirError as exc:
        print(f"error: --out {exc}", file=sys.stderr)
        return 2
    rows, src = load_exemplars(args.data, args.skip_invalid)
    print(f"{len(rows)} exemplar(s) from {len(src['files'])} file(s)"
          + (f"; {src['skipped']} invalid row(s) skipped" if src["skipped"] else ""))
    encoder = load_embedding_model(args.embedding_model)

    def progress(done, total):
        print(f"\rembedding {done}/{total}", end="", file=sys.stderr, flush=True)

    info = build_index(rows, encoder.encode, args.embedding_model, args.out,
                       approx_threshold=args.approx_threshold, source_sha256=src["sha256"],
                       progress=progress)
    print(file=sys.stderr)
    print(f"wrote {Path(args.out).resolve()}: {info['count']} vectors, dim {info['dim']}, "
          f"{info['kind']} index, embedding model {info['embedding_model']}")
    return 0


def query(args) -> int:
    from peer_rl.retrieval.index import ExemplarIndex, Query, exemplar_key
    from workers.redundancy import load_embedding_model

    index = ExemplarIndex(args.index)
    encoder = load_embedding_model(index.info["embedding_model"])
    history = [{"role": "seeker", "content": args.text}]
    key = exemplar_key(history, args.reply)
    res = index.search_vectors(encoder.encode([key]), args.k, [Query(history, args.dialogue)])
    [hits], [excluded] = res.hits, res.excluded
    print(f"{excluded} exemplar(s) of the query's own dialogue passed over"
          + (f" (dialogue {args.dialogue!r} or a history starting with this seeker turn)"
             if args.dialogue else " (a history starting with this seeker turn)"))
    for rank, h in enumerate(hits, start=1):
        e = h.exemplar
        last = next((t["content"] for t in reversed(e["history"]) if t["role"] == "seeker"), "")
        print(f"{rank}. score {h.score:.3f}  id {e['id']}  ({e['language']}"
              + (f", {e['strategy']}" if e.get("strategy") else "") + ")")
        print(f"   seeker:   {last}")
        print(f"   response: {e['response']}")
    return 0
