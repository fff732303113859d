"""`peer-rl` command line: data tooling, training entry points and benchmarks."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _data_check(args) -> int:
    from peer_rl.data.layout import discover
    from peer_rl.data.validate import check_file

    try:
        files = discover(args.root)
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    total_rows = total_bad = 0
    reasons: dict[str, int] = {}
    for df in files:
        rep = check_file(df)
        total_rows += rep.n_lines
        total_bad += rep.n_invalid
        for p in rep.problems[: args.max_problems]:
            print(p, file=sys.stderr)
        if len(rep.problems) > args.max_problems:
            print(f"{df.path}: ... {len(rep.problems) - args.max_problems} more problem(s)",
                  file=sys.stderr)
        for reason, n in rep.reasons().items():
            reasons[reason] = reasons.get(reason, 0) + n
        status = "ok" if not rep.problems else f"{rep.n_invalid} invalid row(s)"
        print(f"{df.rel}: {len(rep.rows)}/{rep.n_lines} valid rows, {status}")
    print(f"checked {len(files)} file(s), {total_rows} row(s): {total_rows - total_bad} valid, "
          f"{total_bad} invalid")
    if total_bad:
        for reason, n in sorted(reasons.items(), key=lambda kv: -kv[1]):
            print(f"  {n:6d} problem(s): {reason}")
        if args.skip_invalid:
            print(f"--skip-invalid: {total_bad} invalid row(s) would be skipped")
            return 0
        return 1
    return 0


def _data_stats(args) -> int:
    from peer_rl.data.layout import discover
    from peer_rl.data.stats import file_stats, format_stats
    from peer_rl.data.validate import check_file

    try:
        stats = [file_stats(check_file(df)) for df in discover(args.root)]
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(stats, ensure_ascii=False, indent=1) if args.json else format_stats(stats))
    return 0


def _data_sample(args) -> int:
    from peer_rl.data.sample import build_sample

    counts = build_sample(args.out)
    for rel, n in counts.items():
        print(f"{rel}: {n} rows")
    print(f"wrote the sample dataset to {Path(args.out).resolve()}")
    return 0


def _data_import_esconv(args) -> int:
    from peer_rl.data.esconv import import_esconv
    from peer_rl.data.sample import _write_jsonl

    try:
        rows, rep = import_esconv(args.file, args.rounds_per_dialogue, args.seed, args.language)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    out = Path(args.out) / "grpo" / args.name
    _write_jsonl(out, rows)
    print(f"{rep.dialogues} dialogue(s) -> {rep.rows} grpo row(s) in {out}")
    for reason, n in rep.skipped.items():
        print(f"  skipped {n}: {reason}")
    for name, n in rep.unknown_strategies.items():
        print(f"  {n} turn(s) with unknown strategy {name!r} (kept, strategy empty)")
    return 0


def _add_data(sub) -> None:
    data = sub.add_parser("data", help="dataset tooling").add_subparsers(dest="data_cmd", required=True)
    p = data.add_parser("check", help="validate every row of a PEER-layout root")
    p.add_argument("root")
    p.add_argument("--skip-invalid", action="store_true",
                   help="report and count invalid rows but exit 0")
    p.add_argument("--max-problems", type=int, default=50, help="problems printed per file")
    p.set_defaults(fn=_data_check)
    p = data.add_parser("stats", help="per-file counts and label distributions")
    p.add_argument("root")
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=_data_stats)
    p = data.add_parser("sample", help="write the bundled sample dataset")
    p.add_argument("--out", required=True)
    p.set_defaults(fn=_data_sample)
    p = data.add_parser("import-esconv", help="ESConv-format dialogues -> grpo rows")
    p.add_argument("file")
    p.add_argument("--out", required=True, help="PEER-layout root to write grpo/<name> into")
    p.add_argument("--name", default="esconv.jsonl")
    p.add_argument("--rounds-per-dialogue", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--language", default="en", choices=["en", "zh"])
    p.set_defaults(fn=_data_import_esconv)


def _bench(args) -> int:
    from peer_rl import bench

    return bench.main(args.what, args.rest)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="peer-rl", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    _add_data(sub)
    p = sub.add_parser("bench", help="benchmarks that print a table")
    p.add_argument("what", choices=["rewards", "step"])
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p.set_defaults(fn=_bench)
    args = parser.parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
