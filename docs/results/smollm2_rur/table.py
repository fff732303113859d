"""The RUR on / off tables of docs/results.md, recomputed from the runs' metrics.jsonl and the
held-out evaluation reports beside this file (the layout `peer-rl chain smollm2` writes:
grpo/<method>_s<seed>/metrics.jsonl, eval/<policy>/<protocol>/report.json), with the chain's
own report code: prints its tables, redraws curves.png here, then prints the per-step spread
the reading in docs/results.md quotes.
Run: .venv/bin/python docs/results/smollm2_rur/table.py"""
import json
import statistics
from pathlib import Path

from peer_rl.chain import report

HERE = Path(__file__).parent
KEYS = ("reward/mean", "reward/format_rate", "rur/s_group/mean", "rur/s_hist/mean")


def steps(run: str) -> list[dict]:
    return [json.loads(ln) for ln in (HERE / "grpo" / run / "metrics.jsonl").read_text().splitlines()
            if ln.strip()]


if __name__ == "__main__":
    runs = report.read_curves(HERE)
    report.plot_runs(runs, HERE / "curves.png")
    for table in (report.training_table(runs), report.held_out_table(HERE),
                  report.safety_table(HERE)):
        print("\n".join(table), end="\n\n")
    print("\nper run, mean over steps 1-20 (and steps 16-20) of each metric:")
    for run in sorted(p.name for p in (HERE / "grpo").iterdir() if p.is_dir()):
        recs = steps(run)
        cells = []
        for k in KEYS:
            xs = [r[k] for r in recs if isinstance(r.get(k), (int, float))]
            if xs:
                cells.append(f"{k} {statistics.mean(xs):.3f} ({statistics.mean(xs[-5:]):.3f})")
        print(f"  {run}: " + "; ".join(cells))
    # the two arms of one seed draw the same prompts at every step (data.seed = seed), so the
    # per-step difference on / off takes the prompts' own spread out
    found = {(m["method"], int(m["seed"])) for m in map(report.RUN.match, runs) if m}
    seeds = sorted(s for m, s in found if m == "peer_rur" and ("peer", s) in found)
    print("\nper seed, RUR on - off at each step (same prompts), mean +- sd over the 20 steps:")
    for k in ("reward/mean", "reward/format_rate"):
        for seed in seeds:
            on = {r["step"]: r[k] for r in steps(f"peer_rur_s{seed}")}
            off = {r["step"]: r[k] for r in steps(f"peer_s{seed}")}
            d = [on[t] - off[t] for t in sorted(on) if t in off]
            print(f"  {k} seed {seed}: {statistics.mean(d):+.3f} +- {statistics.stdev(d):.3f} "
                  f"(step 1: {d[0]:+.3f})")
