"""What an `peer-rl eval` protocol run leaves behind, checked the same wherever it ran
(tests/test_runbook.py runs the four protocols against the served policy)."""
import json
from pathlib import Path


def cases(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "cases.jsonl").read_text().splitlines()]


def dialogue_text(rec) -> list[str]:
    """Every generated or dataset utterance of a case (>= 12 characters, to be distinctive)."""
    keys = ("seeker", "reply", "model_raw", "analysis", "judge_raw", "first_talk")
    found = []

    def walk(x):
        if isinstance(x, dict):
            for k, v in x.items():
                if k in keys and isinstance(v, str):
                    found.append(v)
                else:
                    walk(v)
        elif isinstance(x, list):
            for v in x:
                if isinstance(v, str) and len(v) >= 12:
                    found.append(v)
                else:
                    walk(v)
    walk(rec)
    return [s.strip()[:40] for s in found if len(s.strip()) >= 12]


# each protocol's own figures (evaluation/report.py)
FIGURES = {"esc": ["dimensions"], "sage": ["bands", "trajectories"], "safety": ["groups"],
           "diversity": ["metrics"]}


def check_report(out: Path, protocol: str, expected: int, written: str,
                 esc_rounds: int, diversity_n: int) -> None:
    """A finished run of `protocol` over `expected` cases: each case once and without error,
    the summary, each figure a real PNG of some size, the markdown table, the protocol's own
    figures worked out from its cases, and no dialogue text in `written` (the run's console)."""
    got = cases(out)
    assert sorted(c["id"] for c in got) == sorted({c["id"] for c in got})
    assert len(got) == expected and not any("error" in c for c in got)
    report = json.loads((out / "report.json").read_text())
    s = report["summary"]
    assert s["cases"] == expected and s["errors"] == 0
    assert sorted(f.rsplit("_", 1)[-1].removesuffix(".png") for f in report["figures"]) == \
        FIGURES[protocol]
    for fig in report["figures"]:
        assert (out / fig).read_bytes()[:4] == b"\x89PNG" and (out / fig).stat().st_size > 1000
    assert "|" in (out / "report.md").read_text()
    if protocol == "esc":
        assert all(d["n"] + d["unparsed"] == expected for d in s["dimensions"].values())
        assert all(len(c["turns"]) == esc_rounds for c in got)
    if protocol == "sage":
        assert all(c["trajectory"][0] == 40 and len(c["trajectory"]) == len(c["turns"]) + 1
                   for c in got)
        assert sum(s["bands"].values()) == expected
    if protocol == "safety":
        assert s["overall"]["judged"] + s["overall"]["unparsed"] == expected
    if protocol == "diversity":
        assert s["replies"] == diversity_n * expected and 0 <= s["distinct_1"] <= 1
    texts = [t for c in got for t in dialogue_text(c)]
    assert len(texts) >= expected, len(texts)     # the check below has text to look for
    leaked = [t for t in texts if t in written]
    assert not leaked, (protocol, leaked[:3])
