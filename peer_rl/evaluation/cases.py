"""The inputs of each evaluation, read as their benchmarks publish them and checked field by field.

* ESC-Eval role cards: a JSON list (or JSON Lines) of `{"id", "base", "language", ...}`; `base`
  describes the seeker (age, gender, occupation, problem) in the card's language, `language` is
  english / chinese; `base_biaozhu` (the Chinese annotation), `res` and `source` are kept.
* SAGE profiles: JSON Lines of `{"id", "player", "scene", "task", "first_talk", ...}`; `player`
  is the character sheet, `scene` the background story with how the character reacts, `task`
  the hidden theme the supporter has to find, `first_talk` the opening line. No language field:
  it is inferred from the text.
* Safety probes and diversity prompts are the PEER layout's `safety/` and `grpo/*_test` files
  (peer_rl.data).
* Client-Counselor-Judge contexts: any PEER-layout subset whose rows carry a `history` that ends
  with the seeker (preference/, exemplars/, grpo/; a context shared by several rows counts
  once), or an ESConv JSON file (contexts cut at sampled supporter rounds, as `data
  import-esconv` does).

A malformed item fails with `path:item N: field: expected ...` for every problem; with
`skip_invalid` the valid items run and the skipped ones are counted in the report.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from peer_rl.data.esconv import import_esconv
from peer_rl.data.vocab import infer_language, language_of


class CaseFileError(ValueError):
    def __init__(self, path: Path, problems: list[str]):
        self.problems = problems
        shown = "\n  ".join(problems[:20])
        more = f"\n  ... {len(problems) - 20} more" if len(problems) > 20 else ""
        super().__init__(f"{path}: {len(problems)} invalid item(s) (--skip-invalid runs the "
                         f"others):\n  {shown}{more}")


@dataclass(frozen=True)
class RoleCard:
    id: str
    language: str            # en | zh
    base: str                # the seeker's description


@dataclass(frozen=True)
class SageProfile:
    id: str
    language: str
    player: str
    scene: str
    task: str
    first_talk: str


@dataclass(frozen=True)
class Probe:
    id: str
    language: str
    group: str
    category: str
    history: tuple[str, ...]  # seeker turns


@dataclass(frozen=True)
class DiversityPrompt:
    id: str
    language: str
    messages: tuple          # the policy prompt (peer style)
    history: tuple           # role/content turns (chat style)
    images: tuple[str, ...] = ()
    solution: str = ""       # the reference reply (what the PEER reward compares against)


@dataclass(frozen=True)
class Context:
    id: str
    language: str
    history: tuple           # role/content turns, the seeker's last


@dataclass
class Loaded:
    items: list
    skipped: list[str] = field(default_factory=list)   # "where: why" of each skipped item


def _read_items(path: Path) -> list[tuple[str, object]]:
    """(where, item) pairs from a JSON list or JSON Lines file."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        line = path.read_bytes()[:exc.start].count(b"\n") + 1
        raise CaseFileError(path, [f"{path}:{line}: not UTF-8 (invalid byte at offset "
                                   f"{exc.start}); case files are UTF-8 JSON"]) from None
    if text.lstrip().startswith("["):
        try:
            data = json.loads(text)
        except RecursionError:
            raise CaseFileError(path, [f"{path}: JSON nested too deep to read"]) from None
        except ValueError as exc:
            raise CaseFileError(path, [f"{path}:{exc.lineno}: not valid JSON ({exc.msg})"]) \
                from None
        return [(f"{path}:item {i + 1}", x) for i, x in enumerate(data)]
    out = []
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            out.append((f"{path}:{n}", json.loads(line)))
        except ValueError as exc:
            out.append((f"{path}:{n}", ValueError(f"not valid JSON ({exc.msg})")))
        except RecursionError:
            out.append((f"{path}:{n}", ValueError("JSON nested too deep to read")))
    return out


def _load(path: str | Path, build, skip_invalid: bool) -> Loaded:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    items, problems, seen = [], [], {}
    for where, raw in _read_items(path):
        errs: list[str] = []
        if isinstance(raw, ValueError):
            errs.append(str(raw))
        elif not isinstance(raw, dict):
            errs.append(f"expected a JSON object, got {type(raw).__name__}")
        else:
            item = build(raw, errs)
            if not errs and item.id in seen:
                errs.append(f"id: {item.id!r} repeats {seen[item.id]}")
        if errs:
            problems += [f"{where}: {e}" for e in errs]
            continue
        seen[item.id] = where
        items.append(item)
    if problems and not skip_invalid:
        raise CaseFileError(path, problems)
    if not items:
        raise CaseFileError(path, problems or [f"{path}: no items"])
    return Loaded(items, problems)


def _text(raw: dict, key: str, errs: list[str]) -> str:
    v = raw.get(key)
    if not isinstance(v, str) or not v.strip():
        errs.append(f"{key}: expected a non-empty string, got {_shown(v)}")
        return ""
    return v.strip()


def _id(raw: dict, errs: list[str]) -> str:
    v = raw.get("id")
    if isinstance(v, bool) or not isinstance(v, (int, str)) or str(v).strip() == "":
        errs.append(f"id: expected an integer or a non-empty string, got {_shown(v)}")
        return ""
    return str(v)


def _shown(v) -> str:
    return "nothing" if v is None else f"{type(v).__name__} {json.dumps(v, ensure_ascii=False)[:40]}"


def _card(raw: dict, errs: list[str]) -> RoleCard:
    cid, base = _id(raw, errs), _text(raw, "base", errs)
    lang = language_of(raw.get("language", ""))
    if lang is None:
        errs.append(f"language: expected english or chinese (en, zh), got {_shown(raw.get('language'))}")
    return RoleCard(cid, lang or "", base)


def _profile(raw: dict, errs: list[str]) -> SageProfile:
    pid = _id(raw, errs)
    parts = {k: _text(raw, k, errs) for k in ("player", "scene", "task", "first_talk")}
    lang = language_of(raw.get("language", "")) or infer_language(
        [parts["player"], parts["first_talk"]])
    return SageProfile(pid, lang, **parts)


def load_role_cards(path, skip_invalid: bool = False) -> Loaded:
    return _load(path, _card, skip_invalid)


def load_profiles(path, skip_invalid: bool = False) -> Loaded:
    return _load(path, _profile, skip_invalid)


def seeker_kind(path) -> str:
    """"role_cards" or "profiles": what a file of seeker descriptions holds, told by its first
    JSON object's keys (an ESC-Eval card has `base`, a SAGE profile `player`). A file with
    neither fails naming what each kind needs."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    first = next((raw for _, raw in _read_items(path) if isinstance(raw, dict)), None)
    if first is not None and "base" in first and "player" not in first:
        return "role_cards"
    if first is not None and "player" in first:
        return "profiles"
    keys = sorted(first)[:8] if first is not None else "no JSON object"
    raise ValueError(f"{path}: expected SAGE profiles (id, player, scene, task, first_talk) or "
                     f"ESC-Eval role cards (id, base, language); its first item has {keys}")


def load_seekers(path, skip_invalid: bool = False) -> tuple[str, Loaded]:
    """A file of SAGE profiles or ESC-Eval role cards (seeker_kind), loaded."""
    kind = seeker_kind(path)
    return kind, (load_role_cards if kind == "role_cards" else load_profiles)(path, skip_invalid)


def _peer_rows(root, subset: str, pattern: str, skip_invalid: bool) -> Loaded:
    from peer_rl.data.loading import load_subset  # deferred: pulls in datasets

    res = load_subset(root, subset, pattern, skip_invalid=skip_invalid)
    skipped = [str(p) for rep in res.reports for p in rep.problems]
    return Loaded([dict(r) for r in res.dataset], skipped)


def load_probes(root, skip_invalid: bool = False) -> Loaded:
    """Every row of `safety/*.jsonl` under a PEER-layout root."""
    res = _peer_rows(root, "safety", "*", skip_invalid)
    res.items = [Probe(r["id"], r["language"], r["group"], r["category"],
                       tuple(t["content"] for t in r["history"])) for r in res.items]
    return res


def load_diversity_prompts(root, pattern: str = "*_test", skip_invalid: bool = False) -> Loaded:
    """The GRPO test prompts (`grpo/*_test.jsonl`): the policy prompt, history and frames."""
    res = _peer_rows(root, "grpo", pattern, skip_invalid)
    res.items = [DiversityPrompt(r["id"], r["language"], tuple(r["messages"]),
                                 tuple(r["history"]), tuple(r.get("images") or ()),
                                 r.get("solution") or "")
                 for r in res.items]
    return res


def _contexts(rows: list[dict]) -> list[Context]:
    seen, out = set(), []
    for r in rows:
        key = (r["language"], tuple((t["role"], t["content"]) for t in r["history"]))
        if key not in seen:
            seen.add(key)
            out.append(Context(str(r["id"]), r["language"], tuple(r["history"])))
    return out


def load_contexts(root, subset: str = "preference", pattern: str = "*test*",
                  skip_invalid: bool = False) -> Loaded:
    """Distinct dialogue contexts of `<root>/<subset>/<pattern>.jsonl`."""
    if subset not in ("preference", "exemplars", "grpo"):
        raise ValueError(f"ccj.subset={subset!r}: expected preference, exemplars or grpo (rows "
                         "with a history that ends with the seeker)")
    res = _peer_rows(root, subset, pattern, skip_invalid)
    res.items = _contexts(res.items)
    return res


def load_esconv_contexts(path, per_dialogue: int = 1, seed: int = 0) -> Loaded:
    """Contexts from ESConv dialogues: `per_dialogue` supporter rounds per dialogue (Gaussian
    round sampling, seeded); what the importer skipped is reported as skipped inputs."""
    rows, report = import_esconv(path, rounds_per_dialogue=per_dialogue, seed=seed)
    for r in rows:
        r["language"] = language_of(r["language"])
    skipped = [f"{path}: {why}: {n}" for why, n in report.skipped.items()]
    return Loaded(_contexts(rows), skipped)
