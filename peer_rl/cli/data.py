"""`peer-rl data ...`: check, stats, sample, import-esconv, and the data-building jobs
(filter, personas, rewrite, preference, cold-start, rounds)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from peer_rl.cli.eval import eval_errors
from peer_rl.data.history import training_rows
from peer_rl.data.layout import discover
from peer_rl.data.stats import file_stats, format_stats
from peer_rl.data.validate import check_file
from peer_rl.datajobs.rows import InvalidInput
from peer_rl.files.out_paths import OutputError, claim_dir, claim_files, plain_name



def _errors() -> dict:
    return {FileNotFoundError: 2, OutputError: 2, OSError: 2, ValueError: 2}


def _rounds_errors() -> dict:
    return {OSError: 2, ValueError: 2, InvalidInput: 2}   # OutputError is a ValueError


def _job_errors() -> dict:
    """Bad input or settings -> 2; an unusable endpoint -> 3 with the finished rows saved."""
    return eval_errors() | {InvalidInput: 2, ValueError: 2}


def _data_check(args) -> int:
    files = discover(args.root)
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
    stats = [file_stats(check_file(df)) for df in discover(args.root)]
    print(json.dumps(stats, ensure_ascii=False, indent=1) if args.json else format_stats(stats))
    return 0


def _data_sample(args) -> int:
    from peer_rl.data.bundled import build_sample  # deferred: pulls in PIL

    claim_dir(args.out, "data sample", force=args.force)
    counts = build_sample(args.out)
    for rel, n in counts.items():
        print(f"{rel}: {n} rows")
    print(f"wrote the sample dataset to {Path(args.out).resolve()}")
    return 0


def _data_to_verl(args) -> int:
    from peer_rl.data.loading import load_subset  # deferred: pulls in datasets
    from peer_rl.data.verl_export import export_verl, is_test_file  # deferred (--help)

    claim_dir(args.out, "data to-verl", [args.root], force=args.force)
    res = load_subset(args.root, "grpo", skip_invalid=args.skip_invalid)
    for r in res.reports:
        if r.problems:
            print(f"  skipped {r.n_invalid} invalid row(s) of {r.file.path}")
    held_out = [is_test_file(r.file.path) for r in res.reports for _ in r.rows]
    rows = training_rows(list(res.dataset), args.max_history_turns)
    rep = export_verl([x for x, t in zip(rows, held_out) if not t], args.out, args.val_fraction,
                      args.seed, test_rows=[x for x, t in zip(rows, held_out) if t])
    for split, n in rep.written.items():
        print(f"{split}: {n} rows -> {Path(args.out).resolve() / (split + '.parquet')}")
    for reason, n in rep.skipped.items():
        print(f"  skipped {n}: {reason}")
    for name in rep.removed:
        print(f"  removed {name} (an earlier run's split this run does not write)")
    return 0


def _data_import_esconv(args) -> int:
    from peer_rl.data.esconv import import_esconv  # deferred (--help)
    from peer_rl.data.bundled import _write_jsonl  # deferred: pulls in PIL

    out = Path(args.out) / "grpo" / plain_name(args.name, "--name")
    claim_files(args.out, [f"grpo/{args.name}"], "data import-esconv", [args.file], args.force)
    rows, rep = import_esconv(args.file, args.rounds_per_dialogue, args.seed, args.language)
    _write_jsonl(out, rows)
    print(f"{rep.dialogues} dialogue(s) -> {rep.rows} grpo row(s) in {out}")
    for reason, n in rep.skipped.items():
        print(f"  skipped {n}: {reason}")
    for name, n in rep.unknown_strategies.items():
        print(f"  {n} turn(s) with unknown strategy {name!r} (kept, strategy empty)")
    return 0


def _data_job(args) -> int:
    """The language-model data jobs: bad input or settings -> exit 2, an unusable endpoint ->
    exit 3 with the finished rows saved (rerun the same command to continue)."""
    from peer_rl.datajobs.config import load_job_config  # deferred (--help)

    def run():
        cfg = load_job_config(args.data_cmd.replace("-", "_"), args.overrides)
        if args.data_cmd == "filter":
            from peer_rl.datajobs.filter import run_filter  # deferred (--help)
            return run_filter(args.root, args.out, cfg)
        if args.data_cmd == "personas":
            from peer_rl.datajobs.personas import run_personas  # deferred (--help)
            return run_personas(args.root, args.out, cfg)
        if args.data_cmd == "rewrite":
            from peer_rl.datajobs.rewrite import run_rewrite  # deferred (--help)
            return run_rewrite(args.root, args.personas, args.out, cfg)
        if args.data_cmd == "cold-start":
            from peer_rl.datajobs.cold_start import run_cold_start  # deferred (--help)
            return run_cold_start(args.root, args.out, cfg)
        from peer_rl.datajobs.preference import run_preference  # deferred (--help)
        return run_preference(args.out, cfg)

    _print_job_report(run(), args.out)
    return 0


def _print_job_report(report: dict, out: str) -> None:
    s = report["summary"]
    brief = {k: v for k, v in s.items() if isinstance(v, (int, float, str)) or v is None}
    print(json.dumps(brief, ensure_ascii=False))
    job = report["manifest"]["job"]
    where = Path(out) if job == "personas" else Path(out, "_jobs", job)
    print(f"wrote {(where / 'report.md').resolve()}")


def _data_rounds(args) -> int:
    from peer_rl.datajobs.rounds import run_rounds  # deferred (--help)

    report = run_rounds(args.input, args.out, args.rounds_per_dialogue, args.seed,
                        args.language, args.skip_invalid, args.force)
    _print_job_report(report, args.out)
    return 0


def _data_holdout(args) -> int:
    from peer_rl.datajobs.holdout import run_holdout  # deferred (--help)

    report = run_holdout(args.root, args.out, args.rows, args.seed, args.force)
    for name, what in report["summary"]["files"].items():
        print(f"{name}: {what}")
    print(f"wrote {Path(args.out).resolve()} (the root with its held-out GRPO split; "
          "report in _jobs/holdout)")
    return 0


def _add_data_jobs(data) -> None:
    over = dict(nargs="*", default=[], help="key=value settings (recipes/data.yaml): parties "
                "judge/writer/client/counselor/teacher .url|.path|.model, limit, seed, job sections")
    p = data.add_parser("filter", help="LLM judge on three criteria; writes a root without the "
                        "removed rows and a report")
    p.add_argument("root", help="PEER-layout root (its filter.subsets are judged)")
    p.add_argument("--out", required=True, help="the filtered root (job files in _jobs/filter)")
    p.add_argument("overrides", **over)
    p.set_defaults(fn=_data_job, errors=_job_errors)
    p = data.add_parser("personas", help="DISC persona per SER seeker, K-Means clusters")
    p.add_argument("root")
    p.add_argument("--out", required=True, help="directory for personas.jsonl and the report")
    p.add_argument("overrides", **over)
    p.set_defaults(fn=_data_job, errors=_job_errors)
    p = data.add_parser("rewrite", help="SER train dialogues rewritten with personas of their "
                        "cluster, filtered, appended as source: augmented")
    p.add_argument("root")
    p.add_argument("--personas", required=True, help="a `data personas` output directory")
    p.add_argument("--out", required=True, help="the augmented root (job files in _jobs/rewrite)")
    p.add_argument("overrides", **over)
    p.set_defaults(fn=_data_job, errors=_job_errors)
    p = data.add_parser("preference", help="ESC-Preference pairs from simulated Client / "
                        "Counselor / Judge dialogues")
    p.add_argument("--out", required=True, help="root for preference/ and exemplars/")
    p.add_argument("overrides", **over)
    p.set_defaults(fn=_data_job, errors=_job_errors)
    p = data.add_parser("cold-start", help="ESCRAG-R1 cold-start demonstrations "
                        "(<think>reasoning</think>reply) from a strong teacher model, for both "
                        "policy prompts (cold_start.refined_share of them for pass 2)")
    p.add_argument("root", help="PEER-layout root whose cold_start.subsets give the contexts "
                   "(and whose train exemplars pass 2 retrieves from, unless cold_start.index)")
    p.add_argument("--out", required=True, help="root for cold_start/train.jsonl (job files in "
                   "_jobs/cold_start)")
    p.add_argument("overrides", **over)
    p.set_defaults(fn=_data_job, errors=_job_errors)
    p = data.add_parser("rounds", help="Gaussian sparse round sampling of raw dialogues")
    p.add_argument("input", help="ESConv-style JSON file, grpo JSONL file or PEER-layout root")
    p.add_argument("--out", required=True, help="root for grpo/ (report in _jobs/rounds)")
    p.add_argument("--rounds-per-dialogue", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--language", default="en", choices=["en", "zh"],
                   help="ESConv input: the dialogues' language")
    p.add_argument("--skip-invalid", action="store_true", help="grpo input: leave invalid "
                   "rows out (counted)")
    p.add_argument("--force", action="store_true", help="replace grpo files already in --out")
    p.set_defaults(fn=_data_rounds, errors=_rounds_errors)
    p = data.add_parser("holdout", help="a held-out split of the GRPO prompts, by dialogue "
                        "(grpo/<name>_test.jsonl), in a copy of the root")
    p.add_argument("root", help="PEER-layout root whose grpo/ files are split")
    p.add_argument("--out", required=True, help="a new or empty directory: the root with "
                   "the split (every other file copied)")
    p.add_argument("--rows", type=int, default=200, help="rows held out per grpo file, at "
                   "least (whole dialogues; default 200)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--force", action="store_true", help="replace this command's earlier output")
    p.set_defaults(fn=_data_holdout, errors=_rounds_errors)


def register(sub) -> None:
    data = sub.add_parser("data", help="dataset tooling").add_subparsers(dest="data_cmd",
                                                                         required=True)
    p = data.add_parser("check", help="validate every row of a PEER-layout root")
    p.add_argument("root")
    p.add_argument("--skip-invalid", action="store_true",
                   help="report and count invalid rows but exit 0")
    p.add_argument("--max-problems", type=int, default=50, help="problems printed per file")
    p.set_defaults(fn=_data_check, errors=_errors)
    p = data.add_parser("stats", help="per-file counts and label distributions")
    p.add_argument("root")
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=_data_stats, errors=_errors)
    p = data.add_parser("sample", help="write the bundled sample dataset")
    p.add_argument("--out", required=True, help="a new or empty directory")
    p.add_argument("--force", action="store_true", help="write into a directory that is not "
                   "empty (same-named files are replaced)")
    p.set_defaults(fn=_data_sample, errors=_errors)
    p = data.add_parser("to-verl", help="grpo rows -> verl parquet (train/val, the held-out "
                        "*_test files as test) for the PEER reward manager inside verl")
    p.add_argument("root", help="PEER-layout root (its grpo/ files)")
    p.add_argument("--out", required=True, help="a new or empty directory")
    p.add_argument("--val-fraction", type=float, default=0.05,
                   help="share of the training rows (not *_test) held out as val.parquet")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--skip-invalid", action="store_true", help="leave invalid rows out, counted")
    p.add_argument("--max-history-turns", type=int, default=0,
                   help="the training run's data.max_history_turns (0 = the whole dialogue): "
                   "prompt and history are cut as `peer-rl train` cuts them")
    p.add_argument("--force", action="store_true", help="write into a non-empty directory (an "
                   "earlier run's splits not written again are removed)")
    p.set_defaults(fn=_data_to_verl, errors=_errors)
    p = data.add_parser("import-esconv", help="ESConv-format dialogues -> grpo rows")
    p.add_argument("file")
    p.add_argument("--out", required=True, help="PEER-layout root to write grpo/<name> into")
    p.add_argument("--name", default="esconv.jsonl", help="file name under grpo/")
    p.add_argument("--rounds-per-dialogue", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--language", default="en", choices=["en", "zh"])
    p.add_argument("--force", action="store_true", help="replace grpo/<name> if it exists")
    p.set_defaults(fn=_data_import_esconv, errors=_errors)
    _add_data_jobs(data)
