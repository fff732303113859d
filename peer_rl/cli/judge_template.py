"""`peer-rl judge-template fit|check`: the judge's wording read off SER rows, and SER rows held
against a template (the check `peer-rl train-rm` runs before it trains)."""
from __future__ import annotations

import json
from pathlib import Path

from peer_rl.files.out_paths import claim_file, write_atomic
from peer_rl.prompts.judge import JudgeTemplate, TEMPLATE_FILE, TemplateError, check_rows
from peer_rl.prompts.judge_fit import fit_template

DEFAULT_FILES = ["ser/*/*_train.jsonl"]


def _template_at(path: str):
    p = Path(path)
    if p.is_dir():
        if not (p / TEMPLATE_FILE).exists():
            raise FileNotFoundError(f"{p}: no {TEMPLATE_FILE} (a judge trained by "
                                    "`peer-rl train-rm` has one beside its weights)")
        p = p / TEMPLATE_FILE
    return JudgeTemplate.from_file(p)


def fit(args) -> int:
    from peer_rl.data.loading import located_ser_rows  # deferred: pulls in datasets

    out = claim_file(args.out, "judge-template fit", [args.data], force=args.force)
    rows = located_ser_rows(args.data, args.files or DEFAULT_FILES, args.skip_invalid)
    if not rows:
        raise FileNotFoundError(f"{args.data}: no SER rows in {args.files or DEFAULT_FILES}")
    template, report = fit_template(rows)
    write_atomic(out, template.dumps())
    langs = ", ".join(f"{k} {v['rows']}" for k, v in report["languages"].items())
    print(f"fitted from {len(rows)} SER row(s) ({langs}); the fixed text, per language:")
    for lang, t in template.text.items():
        print(f"[{lang}] system: {t['system']!r}")
        for k, fmt in enumerate(t["steps"], start=1):
            print(f"[{lang}] round {k}: {fmt!r}")
        print(f"[{lang}] round 4: {t['preference']!r}")
        print(f"[{lang}] roles: {t['roles']}  separator: {t['turn_separator']!r}")
    print(f"{report['mismatched']}/{report['checked']} row(s) it cannot reproduce"
          + ("; first:\n  " + "\n  ".join(report["examples"]) if report["examples"] else ""))
    print(f"wrote {out.resolve()}; read the fixed text above, then train with "
          f"`peer-rl train-rm judge.template={out}`")
    return 1 if report["mismatched"] else 0


def check(args) -> int:
    from peer_rl.data.loading import located_ser_rows  # deferred: pulls in datasets

    template = _template_at(args.template) if args.template else JudgeTemplate()
    rows = located_ser_rows(args.data, args.files or DEFAULT_FILES, args.skip_invalid)
    report = check_rows(template, rows, keep=args.show)
    print(report.summary() if report.mismatched
          else f"all {report.checked} SER row(s) match the template")
    if args.json:
        print(json.dumps({"checked": report.checked, "mismatched": report.mismatched,
                          "examples": report.examples}, ensure_ascii=False))
    return 1 if report.mismatched else 0


def _errors() -> dict:
    from peer_rl.data.loading import InvalidDataError  # deferred: pulls in datasets

    return {FileNotFoundError: 2, InvalidDataError: 2, TemplateError: 2, ValueError: 2}


def register(sub) -> None:
    jt = sub.add_parser("judge-template", help="the UnifiReward judge's wording: fit it to SER "
                        "rows, or check rows against it").add_subparsers(dest="template_cmd",
                                                                         required=True)
    p = jt.add_parser("fit", help="read the template off SER rows; list the rows it cannot "
                      "reproduce (exit 1 if any)")
    p.add_argument("data", help="PEER-layout root with ser/")
    p.add_argument("--out", required=True, help="judge_template.json to write (outside the "
                   "data root)")
    p.add_argument("--force", action="store_true", help="replace a template this command wrote")
    p.add_argument("--files", nargs="*", help=f"ser/ paths, globs allowed (default {DEFAULT_FILES})")
    p.add_argument("--skip-invalid", action="store_true", help="fit on the valid rows, count the rest")
    p.set_defaults(fn=fit, errors=_errors)
    p = jt.add_parser("check", help="SER rows held against a template (exit 1 if any differs)")
    p.add_argument("data", help="PEER-layout root with ser/")
    p.add_argument("--template", default="",
                   help="a judge_template.json or a judge directory (default: the built-in one)")
    p.add_argument("--files", nargs="*", help=f"ser/ paths, globs allowed (default {DEFAULT_FILES})")
    p.add_argument("--skip-invalid", action="store_true")
    p.add_argument("--show", type=int, default=5, help="rows that differ to show")
    p.add_argument("--json", action="store_true", help="also print the counts as JSON")
    p.set_defaults(fn=check, errors=_errors)
