"""The seekers a dialogue run trains with (dialogue.profiles) as the run's prompt rows.

Two kinds of file, told apart by their items' keys (peer_rl.evaluation.cases.seeker_kind):
- SAGE profiles (id, player, scene, task, first_talk): the persona is SAGE's character sheet with
  its background and hidden theme, and `first_talk` opens every dialogue;
- ESC-Eval role cards (id, base, language; the benchmark's card_*.json as published): the persona
  is the card. A card has no first message, so the seeker writes one at each step, shared by the
  G dialogues of the card's group (peer_rl.methods.dialogue).

`dialogue.personas` (a `peer-rl data personas` output) adds how each seeker talks: a DISC
persona of its language, drawn per seeker from its id and trainer.seed, its description added to
the seeker's system prompt. The profile or card says who the seeker is and what troubles it; a
persona, built from how real seekers wrote, says how it talks.

`data.languages` keeps the seekers in those languages, as it keeps PEER's rows; the others are
counted in one line. A malformed item fails naming its file and item (data.skip_invalid skips it,
counted).
"""
from __future__ import annotations

import hashlib
import logging
from collections import Counter
from pathlib import Path

from peer_rl.data.personas import load_personas
from peer_rl.data.prompt_loader import PromptPoolError
from peer_rl.data.vocab import language_of

log = logging.getLogger(__name__)


def profile_rows(cfg) -> list[dict]:
    """Each seeker as a row, in file order: its id, persona (the seeker's system prompt), opening
    (None: the seeker writes it), language (en / zh) and source."""
    from peer_rl.evaluation.cases import CaseFileError, load_seekers  # deferred: datasets
    from peer_rl.evaluation.config import SAMPLE_EVAL

    path = Path(cfg.dialogue.profiles or SAMPLE_EVAL / "sage_profiles.jsonl")
    if not path.is_file():
        raise PromptPoolError(f"dialogue.profiles: {path} is not a file (expected SAGE profiles "
                              "or ESC-Eval role cards, JSON Lines or a JSON list)")
    try:
        kind, loaded = load_seekers(path, skip_invalid=cfg.data.skip_invalid)
    except CaseFileError:                    # its items, named one by one
        raise
    except ValueError as exc:                # neither kind of seeker file
        raise PromptPoolError(f"dialogue.profiles: {exc}") from None
    if loaded.skipped:
        log.warning(f"{path}: skipped {len(loaded.skipped)} invalid item(s): "
                    f"{loaded.skipped[:3]}")
    rows = [_row(kind, item) for item in loaded.items]
    rows = _in_languages(rows, cfg.data.languages, path)
    if cfg.dialogue.personas:
        rows = _with_personas(rows, cfg.dialogue.personas, cfg.trainer.seed)
    log.info(f"{len(rows)} seeker(s) from {path} ({kind.replace('_', ' ')}; dialogues of up to "
             f"{cfg.dialogue.max_turns} turns, {cfg.rollout.n} a seeker)")
    return rows


def _row(kind: str, item) -> dict:
    from peer_rl.prompts.seeker import esc_persona, sage_persona

    if kind == "role_cards":
        return {"id": item.id, "persona": esc_persona(item.base, item.language), "opening": None,
                "language": item.language, "modality": "textual", "source": "esc_eval"}
    return {"id": item.id, "persona": sage_persona(item, item.language),
            "opening": item.first_talk, "language": item.language, "modality": "textual",
            "source": "sage"}


def _in_languages(rows: list[dict], languages, path: Path) -> list[dict]:
    if not languages:
        return rows
    wanted = {language_of(x) or x for x in languages}
    kept = [r for r in rows if r["language"] in wanted]
    left = Counter(r["language"] for r in rows if r["language"] not in wanted)
    if left:
        log.warning(f"{path}: data.languages={list(languages)}: left out "
                    + ", ".join(f"{n} {lang}" for lang, n in sorted(left.items())))
    if not kept:
        raise PromptPoolError(f"dialogue.profiles: {path} holds no seeker in data.languages="
                              f"{list(languages)} (it holds {dict(sorted(left.items()))})")
    return kept


def _with_personas(rows: list[dict], directory: str, seed: int) -> list[dict]:
    from peer_rl.prompts.seeker import with_style

    try:
        personas = load_personas(directory)
    except FileNotFoundError:
        raise PromptPoolError(f"dialogue.personas={directory}: no personas.jsonl there (the "
                              f"output of `peer-rl data personas ROOT --out DIR`)") from None
    except ValueError as exc:                     # names the file and the line
        raise PromptPoolError(f"dialogue.personas: {exc}") from None
    by_lang: dict[str, list[dict]] = {}
    for p in sorted(personas.values(), key=lambda p: p["seeker"]):
        by_lang.setdefault(language_of(p["language"]) or p["language"], []).append(p)
    missing = sorted({r["language"] for r in rows} - set(by_lang))
    if missing:
        raise PromptPoolError(f"dialogue.personas={directory}: no persona in {missing} for the "
                              f"seekers in it (it holds {sorted(by_lang)})")
    out = []
    for r in rows:
        persona = draw(r["id"], by_lang[r["language"]], seed)
        out.append({**r, "persona": with_style(r["persona"], persona["description"],
                                               r["language"]), "style": persona["seeker"]})
    log.info(f"seekers talk as DISC personas from {directory} ({len(personas)} persona(s))")
    return out


def draw(seeker_id: str, personas: list[dict], seed: int) -> dict:
    """One of `personas`, chosen by the seeker's id and the run's seed alone."""
    digest = hashlib.sha256(f"{seed}:{seeker_id}".encode()).digest()
    return personas[int.from_bytes(digest[:8], "big") % len(personas)]
