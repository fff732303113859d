"""`peer-rl index build|query`: an exemplar index from ESC-Preference data, and a look at what
it returns (driver side: it loads the embedding model in-process)."""
from __future__ import annotations

from pathlib import Path

from peer_rl.cli.errors import CommandError
from peer_rl.files.out_paths import claim_dir
from peer_rl.log import progress_bar
from peer_rl.retrieval.corpus import describe, load_exemplars, parse_splits


def _errors() -> dict:
    from peer_rl.data.loading import InvalidDataError  # deferred: pulls in datasets
    from peer_rl.retrieval.index import IndexMismatch  # deferred (--help)

    return {FileNotFoundError: 2, InvalidDataError: 2, IndexMismatch: 2, ValueError: 2}


def build(args) -> int:
    from peer_rl.models.encoders import load_embedding_model  # deferred (--help)
    # deferred (--help)
    from peer_rl.retrieval.index import IndexDirError, build_index, check_replaceable

    claim_dir(args.out, "index build", [args.data], force=args.force, create=False)
    try:
        check_replaceable(args.out)
    except IndexDirError as exc:
        raise CommandError(f"--out {exc}") from None
    try:
        splits = parse_splits(args.splits, "--splits")
    except ValueError as exc:
        raise CommandError(str(exc)) from None
    rows, src = load_exemplars(args.data, args.skip_invalid, splits)
    print(describe(src) + (f" (--splits {','.join(splits)})" if src["left_out"] else ""))
    encoder = load_embedding_model(args.embedding_model)

    bars = []

    def progress(done, total):
        if not bars:
            bars.append(progress_bar(total=total, desc="embedding", unit="text"))
        bars[0].n = done
        bars[0].refresh()

    try:
        info = build_index(rows, encoder.encode, args.embedding_model, args.out,
                           approx_threshold=args.approx_threshold, source_sha256=src["sha256"],
                           progress=progress, marker="index build", source_splits=src["splits"])
    finally:
        for bar in bars:
            bar.close()
    held = ", ".join(f"{split} {n}" for split, n in info["splits"].items())
    print(f"wrote {Path(args.out).resolve()}: {info['count']} vectors ({held}), dim "
          f"{info['dim']}, {info['kind']} index, embedding model {info['embedding_model']}")
    return 0


def query(args) -> int:
    from peer_rl.retrieval.index import ExemplarIndex, Query, exemplar_key  # deferred (--help)
    from peer_rl.models.encoders import load_embedding_model  # deferred (--help)

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


def register(sub) -> None:
    from peer_rl.models.encoders import DEFAULT_EMBEDDING_MODEL  # deferred (--help)

    ix = sub.add_parser("index", help="ESCRAG-R1 exemplar index (faiss)").add_subparsers(
        dest="index_cmd", required=True)
    p = ix.add_parser("build", help="embed ESC-Preference exemplars into a faiss index")
    p.add_argument("data", help="a root with exemplars/ (or preference/: the chosen replies), "
                   "or one such .jsonl file")
    p.add_argument("--out", required=True, help="index directory: new, empty, or one an "
                   "earlier `index build` wrote (with --force; replaced once the new one is "
                   "built); anything else is refused")
    p.add_argument("--force", action="store_true", help="replace an index this command built")
    p.add_argument("--embedding-model", default=DEFAULT_EMBEDDING_MODEL,
                   help="as algorithm.rur.embedding_model; queries must use the same")
    p.add_argument("--approx-threshold", type=int, default=50_000,
                   help="exact search up to this many vectors, HNSW above")
    p.add_argument("--skip-invalid", action="store_true", help="index the valid rows, count the rest")
    p.add_argument("--splits", default="train",
                   help="the splits whose files are indexed, comma-separated (default train; "
                   "test.jsonl and *_test.jsonl are test, other names train): test exemplars "
                   "are replies to the dialogues the evaluations ask about")
    p.set_defaults(fn=build, errors=_errors)
    p = ix.add_parser("query", help="what the index returns for a seeker's words")
    p.add_argument("index", help="index directory")
    p.add_argument("text", help="the seeker's last message")
    p.add_argument("--reply", default="", help="an initial reply (the policy's first pass)")
    p.add_argument("-k", type=int, default=3)
    p.add_argument("--dialogue", default=None,
                   help="the query's dialogue id: exemplars carrying it are never returned")
    p.set_defaults(fn=query, errors=_errors)
