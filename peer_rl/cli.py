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
    from peer_rl.data.out_paths import OutputError, refuse_nonempty
    from peer_rl.data.sample import build_sample

    try:
        refuse_nonempty(args.out, args.force)
    except OutputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    counts = build_sample(args.out)
    for rel, n in counts.items():
        print(f"{rel}: {n} rows")
    print(f"wrote the sample dataset to {Path(args.out).resolve()}")
    return 0


def _data_import_esconv(args) -> int:
    from peer_rl.data.esconv import import_esconv
    from peer_rl.data.out_paths import plain_name, refuse_existing
    from peer_rl.data.sample import _write_jsonl

    out = Path(args.out) / "grpo" / args.name
    try:
        plain_name(args.name, "--name")
        refuse_existing([out], args.force)
        rows, rep = import_esconv(args.file, args.rounds_per_dialogue, args.seed, args.language)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
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
    from peer_rl.datajobs.config import load_job_config
    from peer_rl.datajobs.rows import InvalidInput

    def run():
        cfg = load_job_config(args.data_cmd.replace("-", "_"), args.overrides)
        if args.data_cmd == "filter":
            from peer_rl.datajobs.filter import run_filter
            return run_filter(args.root, args.out, cfg)
        if args.data_cmd == "personas":
            from peer_rl.datajobs.personas import run_personas
            return run_personas(args.root, args.out, cfg)
        if args.data_cmd == "rewrite":
            from peer_rl.datajobs.rewrite import run_rewrite
            return run_rewrite(args.root, args.personas, args.out, cfg)
        if args.data_cmd == "cold-start":
            from peer_rl.datajobs.cold_start import run_cold_start
            return run_cold_start(args.root, args.out, cfg)
        from peer_rl.datajobs.preference import run_preference
        return run_preference(args.out, cfg)

    try:
        report, code = _eval_errors(run, args.out)
    except (InvalidInput, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if report is None:
        return code
    _print_job_report(report, args.out)
    return 0


def _print_job_report(report: dict, out: str) -> None:
    import json

    s = report["summary"]
    brief = {k: v for k, v in s.items() if isinstance(v, (int, float, str)) or v is None}
    print(json.dumps(brief, ensure_ascii=False))
    job = report["manifest"]["job"]
    where = Path(out) if job == "personas" else Path(out, "_jobs", job)
    print(f"wrote {(where / 'report.md').resolve()}")


def _data_rounds(args) -> int:
    from peer_rl.datajobs.rounds import run_rounds
    from peer_rl.datajobs.rows import InvalidInput

    try:
        report = run_rounds(args.input, args.out, args.rounds_per_dialogue, args.seed,
                            args.language, args.skip_invalid, args.force)
    except (OSError, ValueError, InvalidInput) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    _print_job_report(report, args.out)
    return 0


def _add_data_jobs(data) -> None:
    over = dict(nargs="*", default=[], help="key=value settings (recipes/data.yaml): parties "
                "judge/writer/client/counselor/teacher .url|.path|.model, limit, seed, job sections")
    p = data.add_parser("filter", help="LLM judge on three criteria; writes a root without the "
                        "removed rows and a report")
    p.add_argument("root", help="PEER-layout root (its filter.subsets are judged)")
    p.add_argument("--out", required=True, help="the filtered root (job files in _jobs/filter)")
    p.add_argument("overrides", **over)
    p.set_defaults(fn=_data_job)
    p = data.add_parser("personas", help="DISC persona per SER seeker, K-Means clusters")
    p.add_argument("root")
    p.add_argument("--out", required=True, help="directory for personas.jsonl and the report")
    p.add_argument("overrides", **over)
    p.set_defaults(fn=_data_job)
    p = data.add_parser("rewrite", help="SER train dialogues rewritten with personas of their "
                        "cluster, filtered, appended as source: augmented")
    p.add_argument("root")
    p.add_argument("--personas", required=True, help="a `data personas` output directory")
    p.add_argument("--out", required=True, help="the augmented root (job files in _jobs/rewrite)")
    p.add_argument("overrides", **over)
    p.set_defaults(fn=_data_job)
    p = data.add_parser("preference", help="ESC-Preference pairs from simulated Client / "
                        "Counselor / Judge dialogues")
    p.add_argument("--out", required=True, help="root for preference/ and exemplars/")
    p.add_argument("overrides", **over)
    p.set_defaults(fn=_data_job)
    p = data.add_parser("cold-start", help="ESCRAG-R1 cold-start demonstrations "
                        "(<think>reasoning</think>reply) from a strong teacher model")
    p.add_argument("root", help="PEER-layout root whose cold_start.subsets give the contexts")
    p.add_argument("--out", required=True, help="root for cold_start/train.jsonl (job files in "
                   "_jobs/cold_start)")
    p.add_argument("overrides", **over)
    p.set_defaults(fn=_data_job)
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
    p.set_defaults(fn=_data_rounds)


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
    p.add_argument("--out", required=True, help="a new or empty directory")
    p.add_argument("--force", action="store_true", help="write into a directory that is not "
                   "empty (same-named files are replaced)")
    p.set_defaults(fn=_data_sample)
    p = data.add_parser("import-esconv", help="ESConv-format dialogues -> grpo rows")
    p.add_argument("file")
    p.add_argument("--out", required=True, help="PEER-layout root to write grpo/<name> into")
    p.add_argument("--name", default="esconv.jsonl", help="file name under grpo/")
    p.add_argument("--rounds-per-dialogue", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--language", default="en", choices=["en", "zh"])
    p.add_argument("--force", action="store_true", help="replace grpo/<name> if it exists")
    p.set_defaults(fn=_data_import_esconv)
    _add_data_jobs(data)


def _train(args) -> int:
    from peer_rl.config import ConfigError
    from peer_rl.worker_group import PoolFailed
    from peer_rl.data.loading import InvalidDataError
    from peer_rl.dataloader import PromptPoolError
    from peer_rl.preemption import EXIT_CODE, RunStopped
    from peer_rl.train import run

    try:
        run(args.overrides)
    except (ConfigError, FileNotFoundError, InvalidDataError, PromptPoolError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except PoolFailed as exc:        # a policy rank died, or a worker past its restarts
        print(f"error: {exc}", file=sys.stderr)
        return 3
    except RunStopped as exc:        # SIGTERM / SIGINT: the step finished and was saved
        print(f"[peer-rl] {exc}", file=sys.stderr)
        return EXIT_CODE
    return 0


def _supervised(args, kind: str) -> int:
    from peer_rl.config import ConfigError
    from peer_rl.config_supervised import load_supervised_config
    from peer_rl.data.loading import InvalidDataError
    from workers.supervised_trainer import TemplateMismatch, run_supervised

    try:
        cfg = load_supervised_config(args.overrides, kind)
        run_supervised(cfg, cfg.kind)     # train-rm runs UnifiReward (rm) or scalar (bt) recipes
    except (ConfigError, FileNotFoundError, InvalidDataError, TemplateMismatch) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


def _eval_rm(args) -> int:
    from peer_rl.data.sample import sample_root
    from peer_rl.eval_rm import evaluate_rm, format_table

    if bool(args.model) == bool(args.prm or args.orm) or bool(args.prm) != bool(args.orm):
        print("error: pass --model (UnifiReward) or both --prm and --orm (the separate pair)",
              file=sys.stderr)
        return 2
    for flag, path in (("--model", args.model), ("--prm", args.prm), ("--orm", args.orm)):
        if path and not Path(path, "config.json").exists():
            print(f"error: {flag} {path}: no config.json there (expected an HF model "
                  "directory, e.g. outputs/unifireward_tiny/final)", file=sys.stderr)
            return 2
    root = args.data or sample_root()
    try:
        report = evaluate_rm(root, args.model or args.prm, args.out, max_tokens=args.max_tokens,
                             kv_cache_gib=args.kv_cache_gib, max_model_len=args.max_model_len,
                             limit=args.limit, images=not args.no_images,
                             pattern=args.pattern,
                             outcome_model=args.orm or None)
    except (FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
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
    from peer_rl.data.loading import InvalidDataError
    from peer_rl.data.sample import sample_root
    from peer_rl.eval_pairs import evaluate_pairs

    if not Path(args.model, "config.json").exists():
        print(f"error: --model {args.model}: no config.json there (expected the final directory "
              "of `peer-rl train-rm recipe=escrag_rm...`)", file=sys.stderr)
        return 2
    try:
        rep = evaluate_pairs(args.data or sample_root(), args.model, args.out, args.files,
                             args.kv_cache_gib, args.max_model_len, args.limit)
    except (FileNotFoundError, InvalidDataError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    langs = ", ".join(f"{k} {v['pairwise_accuracy']:.3f} ({v['pairs']})"
                      for k, v in rep["by_language"].items())
    print(f"pairwise accuracy {rep['pairwise_accuracy']:.3f} on {rep['pairs']} pair(s) "
          f"({langs}); mean margin {rep['mean_margin']:.3f}; {rep['seconds']:.1f} s")
    print(f"wrote {Path(args.out).resolve()}")
    return 0


def _eval_errors(run, out: str):
    """Run an evaluation; bad input -> exit 2, an unusable endpoint -> exit 3 (finished cases
    stay on disk). Returns (result, None) or (None, exit code)."""
    from peer_rl.config import ConfigError
    from peer_rl.data.loading import InvalidDataError
    from peer_rl.evaluation.cases import CaseFileError
    from peer_rl.evaluation.endpoints import EndpointError
    from peer_rl.evaluation.store import RunLocked, RunMismatch

    try:
        return run(), None
    except (ConfigError, FileNotFoundError, InvalidDataError, CaseFileError, RunMismatch,
            RunLocked) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return None, 2
    except EndpointError as exc:
        print(f"error: {exc}\nfinished cases are saved in {out}; rerun the same command "
              "to continue", file=sys.stderr)
        return None, 3


def _eval_protocol(args) -> int:
    from peer_rl.evaluation.config import load_eval_config
    from peer_rl.evaluation.report import REPORT_MD, TABLES, model_label
    from peer_rl.evaluation.run import evaluate

    rag = ["model.prompt=escrag", f"rag.index={args.rag}", f"rag.k={args.rag_k}"] \
        if args.rag else []
    report, code = _eval_errors(lambda: evaluate(
        args.eval_cmd, load_eval_config(args.eval_cmd, rag + list(args.overrides)), args.out),
        args.out)
    if report is None:
        return code
    summary = report["summary"]
    print(TABLES[args.eval_cmd]({model_label(report["manifest"]): summary}))
    print(f"wrote {Path(args.out, REPORT_MD).resolve()}")
    return 0


def _eval_ladder(args) -> int:
    from peer_rl.evaluation.ladder import run_ladder

    md, code = _eval_errors(lambda: run_ladder(args.ladder, args.out, args.overrides), args.out)
    if md is None:
        return code
    print(md.read_text(encoding="utf-8"))
    print(f"wrote {md.resolve()}")
    return 0


def _eval_compare(args) -> int:
    from peer_rl.evaluation.report import compare_runs

    try:
        md = compare_runs(args.runs, args.out, args.names.split(",") if args.names else None)
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(md.read_text(encoding="utf-8"))
    print(f"wrote {md.resolve()}")
    return 0


def _chain(args) -> int:
    from peer_rl.chain import run_chain
    from peer_rl.config import ConfigError

    try:
        return run_chain(args.name, args.overrides, only=args.only, dry_run=args.dry_run)
    except (ConfigError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _chat(args) -> int:
    from peer_rl.chat import chat_loop
    from peer_rl.evaluation.endpoints import EndpointError

    try:
        return chat_loop(args)
    except EndpointError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 3


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
                            "model.prompt=escrag): initial reply, retrieval, final reply")
        p.add_argument("--rag-k", type=int, default=3, help="exemplars per query (--rag)")
        p.add_argument("overrides", nargs="*", help="recipe=NAME and dotted key=value overrides")
        p.set_defaults(fn=_eval_protocol)
    p = ev.add_parser("ladder", help="an ablation ladder or sweep: one eval per rung, then "
                      "compared (recipes/ladders/*.yaml)")
    p.add_argument("ladder", help="a bundled ladder name (escrag_ablation, escrag_retrieval_k) "
                   "or a .yaml path")
    p.add_argument("--out", required=True, help="directory: one run per rung + compare.md")
    p.add_argument("overrides", nargs="*", help="paths.NAME=DIR for the ladder's checkpoints; "
                   "other key=value pairs apply to every rung (judge.url=..., limit=...)")
    p.set_defaults(fn=_eval_ladder)
    p = ev.add_parser("compare", help="several runs side by side (Markdown, JSON, PNG)")
    p.add_argument("runs", nargs="+", help="run directories of `peer-rl eval ...`")
    p.add_argument("--out", required=True, help="directory for compare.md and figures")
    p.add_argument("--names", default="", help="comma-separated model names, in run order")
    p.set_defaults(fn=_eval_compare)


def _index(args) -> int:
    from peer_rl.data.loading import InvalidDataError
    from peer_rl import index_cmd as build
    from peer_rl.retrieval.index import IndexMismatch

    try:
        return build.build(args) if args.index_cmd == "build" else build.query(args)
    except (FileNotFoundError, InvalidDataError, IndexMismatch, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _add_index(sub) -> None:
    from workers.redundancy import DEFAULT_EMBEDDING_MODEL

    ix = sub.add_parser("index", help="ESCRAG-R1 exemplar index (faiss)").add_subparsers(
        dest="index_cmd", required=True)
    p = ix.add_parser("build", help="embed ESC-Preference exemplars into a faiss index")
    p.add_argument("data", help="a root with exemplars/ (or preference/: the chosen replies), "
                   "or one such .jsonl file")
    p.add_argument("--out", required=True, help="index directory: new, empty or an index "
                   "(replaced once the new one is built); anything else is refused")
    p.add_argument("--embedding-model", default=DEFAULT_EMBEDDING_MODEL,
                   help="as algorithm.rur.embedding_model; queries must use the same")
    p.add_argument("--approx-threshold", type=int, default=50_000,
                   help="exact search up to this many vectors, HNSW above")
    p.add_argument("--skip-invalid", action="store_true", help="index the valid rows, count the rest")
    p.set_defaults(fn=_index)
    p = ix.add_parser("query", help="what the index returns for a seeker's words")
    p.add_argument("index", help="index directory")
    p.add_argument("text", help="the seeker's last message")
    p.add_argument("--reply", default="", help="an initial reply (the policy's first pass)")
    p.add_argument("-k", type=int, default=3)
    p.add_argument("--dialogue", default=None,
                   help="the query's dialogue id: exemplars carrying it are never returned")
    p.set_defaults(fn=_index)


def _bench(args) -> int:
    from peer_rl import bench

    return bench.main(args.what, args.rest)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="peer-rl", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    _add_data(sub)
    p = sub.add_parser("train", help="GRPO training (default: the tiny recipe on the sample)",
                       description="peer-rl train [recipe=NAME] [key=value ...], e.g. "
                       "peer-rl train recipe=peer_rur rollout.num_workers=2 trainer.total_steps=5")
    p.add_argument("overrides", nargs="*", help="recipe=NAME and dotted key=value overrides")
    p.set_defaults(fn=_train)
    for name, kind, what in (("train-rm", "rm", "UnifiReward SFT on SER chats (default recipe "
                              "unifireward_tiny)"),
                             ("sft", "sft", "policy SFT on sft/ rows (default recipe sft_tiny)")):
        p = sub.add_parser(name, help=what, description=f"peer-rl {name} [recipe=NAME] "
                           "[key=value ...]; prints the output directory at the end")
        p.add_argument("overrides", nargs="*", help="recipe=NAME and dotted key=value overrides")
        p.set_defaults(fn=lambda args, kind=kind: _supervised(args, kind))
    from peer_rl import judge_template_cmd, models_cmd

    judge_template_cmd.add_parser(sub)
    models_cmd.add_parser(sub)
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
    p.add_argument("--max-tokens", type=int, default=16, help="tokens per judge answer")
    p.add_argument("--kv-cache-gib", type=float, default=1.0)
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--limit", type=int, default=0, help="judge only the first N rows (0: all)")
    p.add_argument("--pattern", default="*_test", help="which ser/ test files (en/*_test: the "
                   "English rows); the majority baseline reads their _train twins")
    p.add_argument("--no-images", action="store_true",
                   help="judge visual rows on their words alone (the paper's ablation)")
    p.set_defaults(fn=_eval_rm)
    p = ev.add_parser("pairs", help="a scalar reward model's pairwise accuracy on preference "
                      "pairs (ESCRAG-R1)")
    p.add_argument("--model", required=True, help="reward model directory (HF format)")
    p.add_argument("--data", default="", help="root with preference/ (default: the sample)")
    p.add_argument("--files", default="test", help="preference/<files>.jsonl (glob)")
    p.add_argument("--out", default="eval_pairs.json", help="JSON report to write")
    p.add_argument("--kv-cache-gib", type=float, default=1.0)
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--limit", type=int, default=0)
    p.set_defaults(fn=_eval_pairs)
    _add_eval_protocols(ev)
    _add_index(sub)
    p = sub.add_parser("chain", help="a pipeline of stages (fetch, sft, train-rm, eval rm, GRPO "
                       "per recipe and seed, evaluations), then a comparison report")
    p.add_argument("name", help="a chain in recipes/chains (e.g. smollm2) or a YAML path")
    p.add_argument("overrides", nargs="*", help="chain values: out=DIR seeds=[0,1] ...")
    p.add_argument("--only", nargs="*", help="run just these stages (the report then shows "
                   "what is on disk)")
    p.add_argument("--dry-run", action="store_true", help="list what would run")
    p.set_defaults(fn=_chain)
    p = sub.add_parser("chat", help="talk to a model in the terminal (the reply shown; "
                       "/reasoning toggles the rest)")
    p.add_argument("model", help="a local model directory or an OpenAI-compatible base URL")
    p.add_argument("--model-name", default="", help="served model name (URL endpoints)")
    p.add_argument("--api-key-env", default="OPENAI_API_KEY")
    p.add_argument("--prompt", default="peer", choices=["peer", "chat", "escrag"])
    p.add_argument("--rag", default="", metavar="INDEX_DIR",
                   help="ESCRAG-R1 RAG inference with this exemplar index (implies "
                        "--prompt escrag)")
    p.add_argument("--rag-k", type=int, default=3)
    p.add_argument("--lang", default="en", choices=["en", "zh"])
    p.add_argument("--show-reasoning", action="store_true")
    p.add_argument("--max-tokens", type=int, default=512)
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--kv-cache-gib", type=float, default=1.0)
    p.set_defaults(fn=_chat)
    p = sub.add_parser("bench", help="benchmarks that print a table")
    p.add_argument("what", choices=["rewards", "step", "sync", "update", "rollout", "overlap",
                                      "trl", "model"])
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p.set_defaults(fn=_bench)
    args, rest = parser.parse_known_args(argv)
    # key=value overrides may also follow an option (`eval ladder NAME --out DIR paths.x=...`)
    if rest and isinstance(getattr(args, "overrides", None), list) \
            and all("=" in r and not r.startswith("-") for r in rest):
        args.overrides += rest
    elif rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
