"""`peer-rl eval rm`: the UnifiReward judge on the SER test splits, as the paper evaluates it.

For every SER test chat the judge answers the row's own 4 user turns (rounds 1-3: one reasoning
step each; round 4: the two candidate replies), greedily, each round seeing its own earlier
answers as assistant turns: the 9-message layout it is trained on. Its answers are parsed with
the RL-time parsers (peer_rl.algos.rewards) and compared with the row's labels (the row's own assistant
turns), per language and modality.

Metrics (per group; an unparseable verdict counts as wrong):
- step_accuracy: for each of steps 1-3, share of samples whose True/False verdict equals the
  label (plus their mean, step_accuracy_mean);
- preference_accuracy: share of samples whose 4-way preference (first better / second better /
  almost equally good / neither usable) equals the label;
- consistency (process-outcome consistency): share of samples whose judgement reproduces the
  label's joint pattern, i.e. all three step verdicts AND the preference verdict equal the
  labels. A sample with right step verdicts but a wrong preference (or the reverse) contradicts
  the labelled process-outcome pattern and is inconsistent;
- inconsistency: share of samples whose process and outcome judgements disagree in
  correctness: all three step verdicts right but the preference wrong, or the preference
  right but a step verdict wrong (PEER: a unified judge makes fewer such evaluations than a
  separate PRM + ORM pair);
- parse_failure_rate: share of the judge's answers (4 per sample) that no parser recognises;
- error_recall: for each of steps 1-3, the share of steps labelled False that the judge also
  calls False (the paper's error recall: a judge that answers True to everything scores 0),
  and their mean; None for a group with no False label at that step;
- balanced_accuracy: for each of steps 1-3, the mean of the shares of True-labelled and of
  False-labelled steps the judge gets right, and their mean: 0.5 for a judge that answers one
  label to everything or guesses, whatever the labels' balance (SER's steps are ~64% True, so
  step accuracy alone rewards answering True); None without both labels at that step.

The rows are also held against the template saved with the judge (`report["template"]`): a
test row that template cannot reproduce is judged here in a wording the RL-time judge never
sees, so its figures do not carry over to training; the CLI warns with the count.

Visual rows show the judge their frame in the Step 2 round (where the trained layout puts it,
peer_rl.supervised.examples.image_turn); `images=False` (`--no-images`) judges the same rows on their
words alone, the paper's ablation of the face (Step 1 recall 55.46% with images, 54.21%
without).

The metric functions and the table are pure; `evaluate_rm` runs the judge (workers/unifireward.py's
UnifiRewardWorker, in-process, vLLM).
"""
from __future__ import annotations

import json
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from peer_rl.config.worker_settings import JudgeSettings
from peer_rl.files.out_paths import write_atomic
from peer_rl.prompts.judge import JudgeTemplate, check_rows
from peer_rl.prompts.multimodal import attach_images, strip_tags
from peer_rl.prompts.verdicts import Preference, parse_preference, parse_step_verdict
from peer_rl.supervised.examples import image_turn

STEP_TURNS = (2, 4, 6)      # assistant messages of a 9-message SER chat holding step verdicts
PREFERENCE_TURN = 8
USER_TURNS = (1, 3, 5, 7)


@dataclass(frozen=True)
class Verdicts:
    """Three step verdicts and the preference; None = unparseable (predictions only)."""
    steps: tuple[bool | None, bool | None, bool | None]
    preference: Preference | None

    @classmethod
    def parse(cls, answers: list[str]) -> "Verdicts":
        """From 4 answers (3 step verdicts, then the preference), with the RL-time parsers."""
        if len(answers) != 4:
            raise ValueError(f"expected 4 answers, got {len(answers)}")
        return cls(tuple(parse_step_verdict(a) for a in answers[:3]), parse_preference(answers[3]))

    @property
    def n_unparsed(self) -> int:
        return sum(v is None for v in self.steps) + (self.preference is None)


def ser_labels(row: dict) -> Verdicts:
    """The labels of a SER row: its own assistant turns, which must all parse."""
    msgs = row["messages"]
    if len(msgs) != 9:
        raise ValueError(f"{row.get('id', '?')}: expected a 9-message SER chat, got {len(msgs)}")
    v = Verdicts.parse([msgs[i]["content"] for i in STEP_TURNS + (PREFERENCE_TURN,)])
    if v.n_unparsed:
        raise ValueError(f"{row.get('id', '?')}: a label does not parse: "
                         f"{[msgs[i]['content'] for i in STEP_TURNS + (PREFERENCE_TURN,)]}")
    return v


def group_key(row: dict) -> str:
    """'<lang>/<modality>': visual when the row has images."""
    return f"{row.get('lang', '?')}/{'visual' if row.get('images') else 'text'}"


def rm_metrics(labels: list[Verdicts], predictions: list[Verdicts]) -> dict:
    """The four metrics over aligned (label, prediction) lists; see the module docstring."""
    if len(labels) != len(predictions):
        raise ValueError(f"{len(labels)} labels vs {len(predictions)} predictions")
    n = len(labels)
    if n == 0:
        return {"n": 0}
    step_ok = [[p.steps[k] is not None and p.steps[k] == y.steps[k] for y, p in
                zip(labels, predictions)] for k in range(3)]
    pref_ok = [p.preference is not None and p.preference == y.preference
               for y, p in zip(labels, predictions)]
    step_acc = {f"step{k + 1}": sum(step_ok[k]) / n for k in range(3)}
    joint = [all(step_ok[k][i] for k in range(3)) and pref_ok[i] for i in range(n)]
    split = [all(step_ok[k][i] for k in range(3)) != pref_ok[i] for i in range(n)]
    recall = {}
    for k in range(3):
        wrong = [p.steps[k] is False for y, p in zip(labels, predictions) if y.steps[k] is False]
        recall[f"step{k + 1}"] = sum(wrong) / len(wrong) if wrong else None
    known = [v for v in recall.values() if v is not None]
    balanced = {}
    for k in range(3):
        per_label = []
        for label in (True, False):
            hits = [p.steps[k] is label for y, p in zip(labels, predictions)
                    if y.steps[k] is label]
            if hits:
                per_label.append(sum(hits) / len(hits))
        balanced[f"step{k + 1}"] = sum(per_label) / 2 if len(per_label) == 2 else None
    both = [v for v in balanced.values() if v is not None]
    return {
        "n": n,
        "step_accuracy": step_acc,
        "step_accuracy_mean": sum(step_acc.values()) / 3,
        "error_recall": recall,
        "error_recall_mean": sum(known) / len(known) if known else None,
        "balanced_accuracy": balanced,
        "balanced_accuracy_mean": sum(both) / len(both) if both else None,
        "preference_accuracy": sum(pref_ok) / n,
        "consistency": sum(joint) / n,
        "inconsistency": sum(split) / n,
        "parse_failure_rate": sum(p.n_unparsed for p in predictions) / (4 * n),
    }


def majority_verdicts(rows: list[dict]) -> Verdicts:
    """The constant judge: the commoner label of each step and the commonest preference over
    `rows` (ties to True, then to the preference listed first in verdicts.Preference)."""
    labels = [ser_labels(r) for r in rows]
    if not labels:
        raise ValueError("no rows to take a majority label from")
    steps = tuple(2 * sum(y.steps[k] for y in labels) >= len(labels) for k in range(3))
    counts = {p: sum(y.preference == p for y in labels) for p in Preference}
    return Verdicts(steps, max(counts, key=lambda p: counts[p]))


def grouped_metrics(rows: list[dict], predictions: list[Verdicts]) -> dict[str, dict]:
    """rm_metrics per '<lang>/<modality>' group (sorted) and over everything ('all')."""
    labels = [ser_labels(r) for r in rows]
    groups: dict[str, list[int]] = defaultdict(list)
    for i, r in enumerate(rows):
        groups[group_key(r)].append(i)
    out = {g: rm_metrics([labels[i] for i in idx], [predictions[i] for i in idx])
           for g, idx in sorted(groups.items())}
    out["all"] = rm_metrics(labels, predictions)
    return out


def format_table(groups: dict[str, dict]) -> str:
    """A fixed-width table: one line per group."""
    head = (f"{'group':<11} {'n':>5} {'step1':>6} {'step2':>6} {'step3':>6} {'pref':>6} "
            f"{'consist':>7} {'inconsist':>9} {'parse_fail':>10} {'recall1':>7} {'recall2':>7} "
            f"{'recall3':>7} {'bal_acc':>7}")
    lines = [head, "-" * len(head)]
    for name, m in groups.items():
        if not m.get("n"):
            lines.append(f"{name:<11} {0:>5}")
            continue
        s, r = m["step_accuracy"], m["error_recall"]
        recall = " ".join(f"{'-' if r[k] is None else format(r[k], '.3f'):>7}"
                          for k in ("step1", "step2", "step3"))
        b = m.get("balanced_accuracy_mean")
        bal = "-" if b is None else format(b, ".3f")
        lines.append(f"{name:<11} {m['n']:>5} {s['step1']:>6.3f} {s['step2']:>6.3f} "
                     f"{s['step3']:>6.3f} {m['preference_accuracy']:>6.3f} "
                     f"{m['consistency']:>7.3f} {m['inconsistency']:>9.3f} "
                     f"{m['parse_failure_rate']:>10.3f} {recall} {bal:>7}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------- judge runner
def judge_chat(row: dict, images: bool = True) -> list[dict]:
    """A SER row's 9 messages, its frame placed in the Step 2 round (or its words alone)."""
    if images and row.get("images"):
        return attach_images(row["messages"], list(row["images"]),
                             turn=image_turn("ser", row["messages"]))
    return strip_tags(row["messages"])


def judge_rows(worker, rows: list[dict], images: bool = True,
               turns: tuple[int, ...] = USER_TURNS) -> list[list[str]]:
    """Batched greedy rounds over the rows' own user turns (all 4, or `turns`): round k for
    every row at once, each conversation carrying the judge's earlier answers (system + 4 x
    (user, assistant)). `worker` is a UnifiRewardWorker (or anything with its
    `answer(conversations) -> texts`)."""
    chats = [judge_chat(r, images) for r in rows]
    convs = [[c[0]] for c in chats]
    answers: list[list[str]] = [[] for _ in rows]
    for k in turns:
        replies = worker.answer([conv + [c[k]] for conv, c in zip(convs, chats)])
        for i, text in enumerate(replies):
            convs[i] += [chats[i][k], {"role": "assistant", "content": text}]
            answers[i].append(text)
    return answers


def judge_rows_pair(pair, rows: list[dict], images: bool = True) -> list[list[str]]:
    """The PRM + ORM pair on the rows: the process model answers each row's rounds 1-3 (its
    own turns, as judge_rows), the outcome model one turn with the history and both replies
    (read back through the template, peer_rl.prompts.judge.outcome_chat)."""
    steps = judge_rows(pair.process, rows, images, turns=USER_TURNS[:3])
    template = pair.outcome.template
    chats = []
    for r in rows:
        chat = template.outcome_chat(template.match(strip_tags(r["messages"]), r["lang"]),
                                     r["lang"])[:2]
        if images and r.get("images"):
            chat = attach_images(chat, list(r["images"]), turn=1)
        chats.append(chat)
    prefs = pair.outcome.answer(chats)
    return [s + [p] for s, p in zip(steps, prefs)]


def _verdicts_json(v: Verdicts) -> dict:
    return {"steps": list(v.steps), "preference": v.preference.name if v.preference else None}


def _fits(worker, row: dict) -> bool:
    """The whole chat (with verdict-length answers) fits the judge's context."""
    tok, limit = getattr(worker, "tokenizer", None), getattr(worker, "max_model_len", None)
    if tok is None or not limit:
        return True
    text = tok.apply_chat_template(row["messages"], tokenize=False)
    return len(tok.encode(text, add_special_tokens=False)) + 4 * worker.max_tokens <= limit


def load_test_rows(root: str | Path, pattern: str = "*_test") -> list[dict]:
    """Validated SER rows of the test splits (ser/<lang>/{text,visual}_test.jsonl)."""
    from peer_rl.data.loading import load_subset  # deferred: pulls in datasets

    return [dict(r) for r in load_subset(root, "ser", pattern).dataset]


def train_seconds(model) -> float | None:
    """The wall seconds `peer-rl train-rm` took to make this model (train_time.json), if known."""
    path = Path(model) / "train_time.json"
    return json.loads(path.read_text(encoding="utf-8"))["seconds"] if path.exists() else None


def _readable(template, row: dict) -> bool:
    return check_rows(template, [("", row)]).mismatched == 0


def _template_report(model, rows: list[dict]) -> dict:
    """The test rows held against the template saved with the judge: rows it cannot reproduce
    measure the judge on a wording the RL-time judge is never asked in."""
    check = check_rows(JudgeTemplate.load(model), [(str(r.get("id")), r) for r in rows], keep=3)
    return {"checked": check.checked, "mismatched": check.mismatched, "examples": check.examples}


def evaluate_rm(root: str | Path, model: str, out: str | Path | None = None, *,
                worker=None, max_tokens: int = 16, kv_cache_gib: float = 1.0,
                max_model_len: int = 4096, limit: int = 0, pattern: str = "*_test",
                seed: int = 0, images: bool = True, outcome_model: str | None = None) -> dict:
    """Judge the SER test rows with the model at `model` (UnifiReward), or with the PRM at
    `model` and the ORM at `outcome_model`; return (and write to `out`) the report.

    `worker` defaults to a UnifiRewardWorker (PairRewardWorker for a pair) built on the models
    (vLLM, in-process; a script that calls this needs an `if __name__ == "__main__":` guard).
    Tests pass a scripted stand-in.
    """
    rows = load_test_rows(root, pattern)
    if limit:
        rows = rows[:limit]
    train_pattern = pattern.replace("_test", "_train")
    majority_rows = load_test_rows(root, train_pattern) if train_pattern != pattern else rows
    template = _template_report(model, rows)
    pair = outcome_model is not None
    own = worker is None
    if own:
        # deferred: pulls in torch
        from peer_rl.workers.unifireward import PairRewardWorker, UnifiRewardWorker

        engine = JudgeSettings(kv_cache_gib=kv_cache_gib, max_tokens=max_tokens,
                               max_model_len=max_model_len)
        worker = (PairRewardWorker(str(model), str(outcome_model), engine, seed=seed) if pair
                  else UnifiRewardWorker(str(model), engine, seed=seed))
    # a text-only judge reads visual rows on their words alone, as it was trained on them
    images = images and bool(getattr(worker, "multimodal", True))
    try:
        t0 = time.perf_counter()
        kept = [r for r in rows if _fits(worker, r)]
        unreadable = 0
        if pair:              # the ORM's turn is rebuilt from what the template reads
            readable = [r for r in kept if _readable(worker.outcome.template, r)]
            unreadable, kept = len(kept) - len(readable), readable
        answers = ((judge_rows_pair(worker, kept, images) if pair
                    else judge_rows(worker, kept, images)) if kept else [])
        seconds = time.perf_counter() - t0
    finally:
        if own:
            worker.close()
    predictions = [Verdicts.parse(a) for a in answers]
    report = {
        "model": str(model), "data": str(root), "pattern": pattern,
        "judges": ({"kind": "prm_orm", "process": str(model), "outcome": str(outcome_model),
                    "train_seconds": {"process": train_seconds(model),
                                      "outcome": train_seconds(outcome_model)}} if pair else
                   {"kind": "unified", "train_seconds": {"unified": train_seconds(model)}}),
        "n_rows": len(rows), "n_too_long": len(rows) - len(kept) - unreadable,
        "n_unreadable": unreadable,
        "images": images and bool(getattr(worker, "multimodal", False)),
        "note": ("visual rows show the judge their frame in the Step 2 round"
                 if images and getattr(worker, "multimodal", False) else
                 "visual rows are judged on their words alone (--no-images or a text-only "
                 "judge)"),
        "template": template,
        "metrics": grouped_metrics(kept, predictions) if kept else {},
        # what a judge that always answers the training split's majority labels scores here
        "majority_baseline": {
            "from": train_pattern if train_pattern != pattern else pattern,
            "verdicts": _verdicts_json(majority_verdicts(majority_rows)),
            "metrics": (grouped_metrics(kept, [majority_verdicts(majority_rows)] * len(kept))
                        if kept else {})},
        "seconds": round(seconds, 2),
        "samples": [{"id": r.get("id"), "group": group_key(r), "answers": a}
                    for r, a in zip(kept, answers)],
    }
    if out is not None:
        write_atomic(out, json.dumps(report, ensure_ascii=False, indent=1))   # a chain's mark
    return report
