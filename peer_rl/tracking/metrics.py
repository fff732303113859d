"""Step metrics: reply statistics and the sinks (console, metrics.jsonl, TensorBoard, and the
trackers of peer_rl.tracking.trackers)."""
from __future__ import annotations

import json
import logging
import resource
import sys
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from peer_rl.files.out_paths import open_append, read_jsonl, repair_jsonl

logger = logging.getLogger(__name__)


def peak_rss_bytes() -> int:
    """This process's peak resident memory (Linux reports ru_maxrss in KiB). On CPU a vLLM
    engine runs inside its worker's process, so a pool's figure includes its engine."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def distinct_n(texts: list[str], n: int) -> float:
    """Share of unique n-grams among all n-grams of the replies (CJK characters are tokens)."""
    from peer_rl.algos.rewards import _CJK  # deferred: pulls in torch

    grams, total = set(), 0
    for t in texts:
        toks = _CJK.sub(lambda m: f" {m.group(0)} ", t).split()
        for i in range(len(toks) - n + 1):
            grams.add(tuple(toks[i:i + n]))
            total += 1
    return len(grams) / total if total else 0.0


def summarise(prefix: str, values) -> dict:
    v = np.asarray(values, dtype=np.float64)
    if v.size == 0:
        return {}
    return {f"{prefix}/mean": float(v.mean()), f"{prefix}/max": float(v.max()),
            f"{prefix}/min": float(v.min())}


def truncate_jsonl(path: Path, last_step: int) -> int:
    """Keep only records with step <= last_step: a resumed run re-does later steps. A last line
    that does not parse (a crash mid-write) is dropped with a warning; one elsewhere is a
    damaged file and stops the resume, naming the line. The file is rewritten atomically;
    records keep the names they were written under (read_metrics maps old ones). Returns the
    number of torn lines dropped."""
    _, torn = repair_jsonl(path, last_step)
    if torn:
        logger.warning(f"{path}:{torn}: dropped a torn last line (cut off "
                       "by a crash mid-write)")
    return 1 if torn else 0


# one word per idea (issue 59), verl's names where it has them: an old name on the left is
# read back as the one on its right, so metrics.jsonl files written before still plot and report.
# An entry ending in "/" renames a whole family (timing/<stage> -> timing_s/<stage>). Renames
# chain: a name renamed twice reads back under the newest (timing/rollout_final ->
# timing_s/rollout_final -> timing_s/rollout_refined).
RENAMED = {"actor/clip_frac": "actor/pg_clipfrac", "actor/approx_kl": "actor/ppo_kl",
           "timing/": "timing_s/",
           "reward/final_mean": "reward/refined_mean",
           "reward/final_minus_initial": "reward/refined_minus_initial",
           "groups/zero_variance_share/final": "groups/zero_variance_share/reweighted",
           "timing_s/rollout_final": "timing_s/rollout_refined"}


def current_name(key: str) -> str:
    """`key` under today's name (RENAMED, followed to its newest name); a key never renamed
    comes back as it is."""
    for _ in range(len(RENAMED) + 1):      # a chain is shorter unless the table cycles
        for old, new in RENAMED.items():
            if key == old or (old.endswith("/") and key.startswith(old)):
                key = new + key[len(old):]
                break
        else:
            return key
    raise ValueError(f"RENAMED cycles at {key!r}")


def read_metrics(path: str | Path) -> list[dict]:
    """metrics.jsonl's records under today's names; a torn last line (a crash mid-append) is
    left out, a damaged line elsewhere raises peer_rl.files.out_paths.DamagedFile."""
    return [{current_name(k): v for k, v in rec.items()} for rec in read_jsonl(path)[0]]


# the append-only logs of a run directory: a resume cuts each back to its checkpoint's step
LOGS = ("metrics.jsonl", "samples.jsonl", "timeline.jsonl")


class MetricsSink:
    """Writes one JSON object per step; on resume, drops records past the resumed step."""

    def __init__(self, output_dir: Path, loggers: list[str], resume_step: int | None = None,
                 trackers=None):
        self.trackers = trackers             # peer_rl.tracking.trackers.Trackers (W&B, MLflow) or None
        self.path = output_dir / "metrics.jsonl"
        self.loggers = set(loggers)
        for path in (output_dir / name for name in LOGS):
            if resume_step is not None:
                truncate_jsonl(path, resume_step)
            elif path.exists():
                path.unlink()  # a fresh run owns its output directory
        self.tb = None
        if "tensorboard" in self.loggers:
            try:
                from torch.utils.tensorboard import SummaryWriter  # deferred: torch

                self.tb = SummaryWriter(str(output_dir / "tensorboard"))
            except (ImportError, ModuleNotFoundError):
                self.tb = None  # tensorboard not installed: console + jsonl only

    def log(self, step: int, metrics: dict) -> None:
        record = {"step": step, **{k: v for k, v in metrics.items()}}
        if "jsonl" in self.loggers:
            with open_append(self.path) as fh:
                fh.write(json.dumps(record) + "\n")
        if self.tb is not None:
            for k, v in metrics.items():
                if isinstance(v, (int, float)):
                    self.tb.add_scalar(k, v, step)
            self.tb.flush()
        if self.trackers is not None:
            self.trackers.log(step, metrics)
        if "console" in self.loggers:
            keys = ("reward/mean", "reward/rur_mean", "reward/format_rate",
                    "judge/parse_failure_rate", "actor/kl_loss", "response/length_mean",
                    "timing_s/step")
            shown = " ".join(f"{k.split('/', 1)[1] if k != 'timing_s/step' else 'sec'}="
                             f"{metrics[k]:.3f}" for k in keys if k in metrics)
            print(f"[step {step}] {shown}", file=sys.stderr, flush=True)
            ev = [k for k in ("eval/diversity/distinct_2", "eval/diversity/self_similarity",
                              "eval/safety/pass_rate") if k in metrics]
            if ev:
                print(f"[eval {step}] " + " ".join(f"{k.split('/', 1)[1]}={metrics[k]:.3f}"
                                                   for k in ev), file=sys.stderr, flush=True)

    @contextmanager
    def closed_on_error(self):
        """A step that raises closes the trackers' runs as failed (W&B and MLflow otherwise
        show a crashed run as still running)."""
        try:
            yield
        except BaseException:
            self.close(ok=False)
            raise

    def close(self, ok: bool = True) -> None:
        if self.tb is not None:
            self.tb.close()
        if self.trackers is not None:
            self.trackers.close(ok)
