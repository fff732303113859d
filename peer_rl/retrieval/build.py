"""`peer-rl index build|query`: an exemplar index from ESC-Preference data, and a look at what
it returns."""
from __future__ import annotations

import hashlib
import sys
from pathlib import Path


def load_exemplars(data: str | Path, skip_invalid: bool = False) -> tuple[list[dict], dict]:
    """Exemplars from a root with exemplars/ (else preference/: the chosen replies), or from one
    such .jsonl file; rows are validated like every subset (`path:line: field`)."""
    from peer_rl.data.layout import DataFile, discover
    from peer_rl.data.loading import InvalidDataError
    from peer_rl.data.validate import check_file

    data = Path(data)
    if data.is_file():
        subset = "preference" if data.parent.name == "preference" else "exemplars"
        files = [DataFile(data, subset, data.parent, None, None)]
    else:
        found = discover(data)
        files = [f for f in found if f.subset == "exemplars"] or \
            [f for f in found if f.subset == "preference"]
        if not files:
            raise FileNotFoundError(f"{data}: no exemplars/*.jsonl or preference/*.jsonl")
    reports = [check_file(f) for f in files]
    if not skip_invalid and any(r.problems for r in reports):
        raise InvalidDataError(reports)
    rows, digest = [], hashlib.sha256()
    for rep in reports:
        digest.update(rep.file.path.read_bytes())
        for r in rep.rows:
            if rep.file.subset == "preference":
                r = {"id": r["id"], "language": r["language"], "history": r["history"],
                     "response": r["chosen"], "source": r.get("source", "")}
            rows.append(r)
    skipped = sum(r.n_invalid for r in reports)
    return rows, {"files": [str(r.file.path) for r in reports], "skipped": skipped,
                  "sha256": digest.hexdigest()}


def build(args) -> int:
    from peer_rl.retrieval.index import build_index
    from workers.redundancy import load_embedding_model

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
    from peer_rl.retrieval.index import ExemplarIndex, exemplar_key
    from workers.redundancy import load_embedding_model

    index = ExemplarIndex(args.index)
    encoder = load_embedding_model(index.info["embedding_model"])
    key = exemplar_key([{"role": "seeker", "content": args.text}], args.reply)
    [hits] = index.search_vectors(encoder.encode([key]), args.k)
    for rank, h in enumerate(hits, start=1):
        e = h.exemplar
        last = next((t["content"] for t in reversed(e["history"]) if t["role"] == "seeker"), "")
        print(f"{rank}. score {h.score:.3f}  id {e['id']}  ({e['language']}"
              + (f", {e['strategy']}" if e.get("strategy") else "") + ")")
        print(f"   seeker:   {last}")
        print(f"   response: {e['response']}")
    return 0
