"""`peer-rl eval ...`: the reward models' own evaluations (rm, pairs), the papers' evaluations
against endpoints (esc, sage, safety, diversity, ccj), ladders and comparisons."""
from __future__ import annotations

import sys
from pathlib import Path

from peer_rl.cli.errors import CommandError, Exit
from peer_rl.errors import ConfigError
from peer_rl.evaluation.store import RunLocked, RunMismatch
from peer_rl.files.out_paths import claim_dir, claim_file
from peer_rl.models.local import check_model_dir


def eval_errors() -> dict:
    """Bad input -> 2; an unusable endpoint -> 3, the finished cases staying on disk."""
    from peer_rl.data.loading import InvalidDataError  # deferred: pulls in datasets
    from peer_rl.evaluation.cases import CaseFileError  # deferred (--help)
    from peer_rl.evaluation.endpoints import EndpointError  # deferred (--help)

    return {EndpointError: Exit(3, then="finished cases are saved in {out}; rerun the same "
                                     "command to continue"),
            ConfigError: 2, FileNotFoundError: 2, InvalidDataError: 2, CaseFileError: 2,
            RunMismatch: 2, RunLocked: 2}


def _rm_errors() -> dict:
    return {FileNotFoundError: 2, ValueError: 2}


def _pairs_errors() -> dict:
    from peer_rl.data.loading import InvalidDataError  # deferred: pulls in datasets

    return {FileNotFoundError: 2, InvalidDataError: 2, ConfigError: 2}


def _file_errors() -> dict:
    return {FileNotFoundError: 2, ConfigError: 2}   # an output refused, a report damaged


def _eval_rm(args) -> int:
    from peer_rl.data.bundled import sample_root  # deferred: pulls in PIL
    from peer_rl.evaluation.rm import evaluate_rm, format_table  # deferred (--help)

    if bool(args.model) == bool(args.prm or args.orm) or bool(args.prm) != bool(args.orm):
        raise CommandError("pass --model (UnifiReward) or both --prm and --orm (the separate "
                           "pair)")

    for flag, path in (("--model", args.model), ("--prm", args.prm), ("--orm", args.orm)):
        if path:
            check_model_dir(f"{flag} {path}", path, error=CommandError,
                            example="outputs/unifireward_tiny/final")
    root = args.data or sample_root()
    claim_file(args.out, "eval rm", [root, args.model, args.prm, args.orm], args.force)
    report = evaluate_rm(root, args.model or args.prm, args.out, max_tokens=args.max_tokens,
                         kv_cache_gib=args.kv_cache_gib, max_model_len=args.max_model_len,
                         limit=args.limit, images=not args.no_images, pattern=args.pattern,
                         outcome_model=args.orm or None)
    if report["template"]["mismatched"]:
        t = report["template"]
        print(f"warning: {t['mismatched']}/{t['checked']} test row(s) differ from the judge's "
              f"saved template (the RL-time judge is asked through it), e.g. "
              f"{t['examples'][0]}", file=sys.stderr)
    print(format_table(report["metrics"]))
    if report["majority_baseline"]["metrics"]:
        base = report["majority_baseline"]
        print(f"majority-label baseline (always {base['verdicts']}, from "
              f"{base['from']}):")
        print(format_table(base["metrics"]))
    print(f"{report['n_rows'] - report['n_too_long']} SER test chat(s) judged in "
          f"{report['seconds']:.1f} s ({report['n_too_long']} too long for the context); "
          f"{report['note']}")
    if report["metrics"]:
        print(f"parse-failure rate: {report['metrics']['all']['parse_failure_rate']:.3f}")
    secs = {k: v for k, v in report["judges"]["train_seconds"].items() if v is not None}
    if secs:
        print("training time: " + ", ".join(f"{k} {v:.0f} s" for k, v in secs.items())
              + (f" (pair total {sum(secs.values()):.0f} s)" if len(secs) > 1 else ""))
    print(f"wrote {Path(args.out).resolve()}")
    return 0


def _eval_pairs(args) -> int:
    from peer_rl.data.bundled import sample_root  # deferred: pulls in PIL
    # deferred: pulls in numpy, omegaconf, torch, yaml
    from peer_rl.evaluation.pairs import evaluate_pairs

    check_model_dir(f"--model {args.model}", args.model, error=CommandError,
                    example="the final directory of `peer-rl train-rm recipe=escrag_rm...`")
    claim_file(args.out, "eval pairs", [args.data or sample_root(), args.model], args.force)
    rep = evaluate_pairs(args.data or sample_root(), args.model, args.out, args.files,
                         args.kv_cache_gib, args.max_model_len, args.limit)
    langs = ", ".join(f"{k} {v['pairwise_accuracy']:.3f} ({v['pairs']})"
                      for k, v in rep["by_language"].items())
    print(f"pairwise accuracy {rep['pairwise_accuracy']:.3f} on {rep['pairs']} pair(s) "
          f"({langs}); mean margin {rep['mean_margin']:.3f}; {rep['seconds']:.1f} s")
    print(f"wrote {Path(args.out).resolve()}")
    return 0


def _eval_protocol(args) -> int:
    from peer_rl.evaluation.config import load_eval_config  # deferred (--help)
    from peer_rl.evaluation.report import REPORT_MD, TABLES, model_label  # deferred (--help)
    # deferred: pulls in numpy, omegaconf, torch, tqdm, yaml
    from peer_rl.evaluation.run import evaluate

    rag = ["model.prompt=escrag", f"rag.index={args.rag}", f"rag.k={args.rag_k}"] \
        if args.rag else []
    report = evaluate(args.eval_cmd, load_eval_config(args.eval_cmd,
                                                      rag + list(args.overrides)), args.out)
    summary = report["summary"]
    print(TABLES[args.eval_cmd]({model_label(report["manifest"]): summary}))
    print(f"wrote {Path(args.out, REPORT_MD).resolve()}")
    return 0


def _eval_ladder(args) -> int:
    from peer_rl.evaluation.ladder import run_ladder  # deferred (--help)

    claim_dir(args.out, "eval ladder", resume=True)     # each rung is a run that continues
    md = run_ladder(args.ladder, args.out, args.overrides)
    print(md.read_text(encoding="utf-8"))
    print(f"wrote {md.resolve()}")
    return 0


def _eval_compare(args) -> int:
    from peer_rl.evaluation.report import compare_runs  # deferred (--help)

    claim_dir(args.out, "eval compare", args.runs, force=args.force)
    md = compare_runs(args.runs, args.out, args.names.split(",") if args.names else None)
    print(md.read_text(encoding="utf-8"))
    print(f"wrote {md.resolve()}")
    return 0


def _add_eval_protocols(ev) -> None:
    what = {"esc": "ESC-Eval: role cards, 5 rounds with a simulated seeker, 7 dimensions "
                   "scored 0-4 by a judge (needs model, seeker, judge)",
            "sage": "SAGE: a simulated seeker's emotion from 40, sentient score, success "
                    "rate, bands (needs model, seeker)",
            "safety": "the PEER safety probes judged per group (needs model, judge)",
            "diversity": "distinct-n and embedding similarity of replies to the GRPO test "
                         "prompts (needs model)",
            "ccj": "ESCRAG-R1's Client-Counselor-Judge scores 0-10 on seven dimensions for one "
                   "reply per dialogue context (needs model, judge)"}
    for name, help_text in what.items():
        p = ev.add_parser(name, help=help_text, description=help_text + ". Parties: "
                          "<role>.url=http://host:port/v1 [<role>.model=NAME] "
                          "[<role>.api_key_env=VAR] or <role>.path=MODEL_DIR; "
                          "model.prompt=peer|chat|escrag. Rerun with the same --out to continue.")
        p.add_argument("--out", required=True, help="run directory (cases.jsonl, report.*)")
        p.add_argument("--rag", default="", metavar="INDEX_DIR",
                       help="ESCRAG-R1 RAG inference with this exemplar index (sets "
                            "model.prompt=escrag): initial reply, retrieval, refined reply")
        p.add_argument("--rag-k", type=int, default=3, help="exemplars per query (--rag)")
        p.add_argument("overrides", nargs="*", help="recipe=NAME and dotted key=value overrides")
        p.set_defaults(fn=_eval_protocol, errors=eval_errors)
    p = ev.add_parser("ladder", help="an ablation ladder or sweep: one eval per rung, then "
                      "compared (recipes/ladders/*.yaml)")
    p.add_argument("ladder", help="a bundled ladder name (escrag_ablation, escrag_retrieval_k) "
                   "or a .yaml path")
    p.add_argument("--out", required=True, help="directory: one run per rung + compare.md")
    p.add_argument("overrides", nargs="*", help="paths.NAME=DIR for the ladder's checkpoints; "
                   "other key=value pairs apply to every rung (judge.url=..., limit=...)")
    p.set_defaults(fn=_eval_ladder, errors=eval_errors)
    p = ev.add_parser("compare", help="several runs side by side (Markdown, JSON, PNG)")
    p.add_argument("runs", nargs="+", help="run directories of `peer-rl eval ...`")
    p.add_argument("--out", required=True, help="directory for compare.md and figures")
    p.add_argument("--names", default="", help="comma-separated model names, in run order")
    p.add_argument("--force", action="store_true", help="replace an earlier compare output")
    p.set_defaults(fn=_eval_compare, errors=_file_errors)


def register(sub) -> None:
    ev = sub.add_parser("eval", help="evaluations").add_subparsers(dest="eval_cmd", required=True)
    p = ev.add_parser("rm", help="UnifiReward on the SER test splits: step / preference "
                      "accuracy, error recall, consistency, parse failures, per language "
                      "and modality")
    p.add_argument("--data", default="", help="PEER-layout root (default: the bundled sample)")
    p.add_argument("--model", default="", help="UnifiReward directory (HF format)")
    p.add_argument("--prm", default="", help="instead of --model: a process model "
                   "(train-rm recipe=prm...), with --orm")
    p.add_argument("--orm", default="", help="the outcome model (train-rm recipe=orm...)")
    p.add_argument("--out", required=True, help="JSON report to write")
    p.add_argument("--force", action="store_true", help="replace a report this command wrote")
    p.add_argument("--max-tokens", type=int, default=16, help="tokens per judge answer")
    p.add_argument("--kv-cache-gib", type=float, default=1.0)
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--limit", type=int, default=0, help="judge only the first N rows (0: all)")
    p.add_argument("--pattern", default="*_test", help="which ser/ test files (en/*_test: the "
                   "English rows); the majority baseline reads their _train twins")
    p.add_argument("--no-images", action="store_true",
                   help="judge visual rows on their words alone (the paper's ablation)")
    p.set_defaults(fn=_eval_rm, errors=_rm_errors)
    p = ev.add_parser("pairs", help="a scalar reward model's pairwise accuracy on preference "
                      "pairs (ESCRAG-R1)")
    p.add_argument("--model", required=True, help="reward model directory (HF format)")
    p.add_argument("--data", default="", help="root with preference/ (default: the sample)")
    p.add_argument("--files", default="test", help="preference/<files>.jsonl (glob)")
    p.add_argument("--out", default="eval_pairs.json", help="JSON report to write")
    p.add_argument("--force", action="store_true", help="replace a report this command wrote")
    p.add_argument("--kv-cache-gib", type=float, default=1.0)
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--limit", type=int, default=0)
    p.set_defaults(fn=_eval_pairs, errors=_pairs_errors)
    _add_eval_protocols(ev)
