"""docs/config.md is the generator's output for the schema and recipes as they are now, and it
holds every key and recipe, checked by a second walk that does not use the generator."""
from __future__ import annotations

import re
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from peer_rl.config import doc as config_doc
from peer_rl.config.schema import PeerRLConfig

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "config.md"


def _rows(text: str | None = None) -> dict[str, list[str]]:
    """{first cell's code: the row's cells} of the page's tables (or of `text`, a rendering)."""
    out = {}
    text = PAGE.read_text(encoding="utf-8") if text is None else text
    for line in text.splitlines():
        m = re.match(r"\| `([^`]+)` \|(.*)\|$", line)
        if m:
            out[m.group(1)] = [c.strip() for c in re.split(r"(?<!\\)\|", m.group(2))]
    return out


def _leaves(node: DictConfig, prefix: str = "") -> dict:
    """Every leaf key of the structured schema with its default, walked by omegaconf."""
    out = {}
    for key in node.keys():
        value = node._get_node(key)
        if isinstance(value, DictConfig):
            out |= _leaves(value, f"{prefix}{key}.")
        else:
            out[f"{prefix}{key}"] = value._value()
    return out


def _recipes() -> list[str]:
    return sorted(p.stem for p in (ROOT / "recipes").rglob("*.yaml"))


def test_page_is_the_generators_output():
    assert PAGE.read_text(encoding="utf-8") == config_doc.render(), \
        "docs/config.md differs from the schema or recipes: run `python -m peer_rl.config.doc`"


def test_every_schema_key_is_on_the_page_with_its_default():
    rows = _rows()
    leaves = _leaves(OmegaConf.structured(PeerRLConfig))
    assert len(leaves) > 100
    missing = sorted(k for k in leaves if k not in rows)
    assert not missing, f"schema keys not on docs/config.md: {missing}"
    # defaults set by a parent section, not the field's class, and a null: by hand
    assert rows["resources.redundancy.cpus_per_worker"][1] == "`0.5`"
    assert rows["resources.rollout.cpus_per_worker"][1] == "`1.0`"
    assert rows["actor.clip_ratio_low"][1] == "`null`"
    assert rows["actor.gradient_checkpointing"][1] == '`"auto"`'
    # a Literal field's type is its choices, an alias (DType) spelled out
    assert rows["actor.dtype"][0] == '`"auto" or "float32" or "bfloat16"`'
    assert rows["trainer.async_training.staleness"][0] == "`0 or 1`"
    extra = sorted(k for k in rows if k not in leaves and k not in _recipes())
    assert not extra, f"docs/config.md lists keys the schema lacks: {extra}"


def test_comments_are_the_ones_beside_each_key():
    rows = _rows()
    # a comment beside the key, one above it, and one continued onto the next line, which
    # must not leak into the key below it (retrieval.index -> retrieval.k)
    assert rows["trainer.save_freq"][2] == "checkpoint every k steps (0: only at the end)"
    assert rows["trainer.async_training.staleness"][2].startswith(
        "0: each step's rollout waits for the previous update")
    assert rows["retrieval.index"][2].endswith("exemplars/ into &lt;output_dir>/index")
    assert rows["retrieval.k"][2] == "exemplars per query (the paper's best: 3)"
    # ActorConfig redefines gradient_checkpointing: its own comment, not PolicySettings'
    assert rows["actor.gradient_checkpointing"][2].startswith("true \\| false \\| auto")


def test_every_recipe_is_listed():
    rows = _rows()
    recipes = _recipes()
    assert len(recipes) > 30
    missing = [r for r in recipes if r not in rows]
    assert not missing, f"recipes not on docs/config.md: {missing}"
    # the first sentence, cut after "al." and "Dr." only where a sentence ends
    assert rows["peer_rur_drgrpo"][0].startswith("PEER-RUR with Dr. GRPO's objective (Liu et al. "
                                                 "2025): advantages not divided")
    assert rows["peer"][0] == ("PEER (arXiv 2508.09521): GRPO with the UnifiReward process + "
                               "outcome reward, RUR off.")


def test_check_mode_fails_on_a_stale_page(tmp_path, monkeypatch):
    stale = tmp_path / "config.md"
    stale.write_text(config_doc.render().replace("`actor.lr`", "`actor.learning_rate`"))
    monkeypatch.setattr(config_doc, "PAGE", stale)
    assert config_doc.main(["--check"]) == 1
    stale.write_text(config_doc.render())
    assert config_doc.main(["--check"]) == 0


def test_every_schema_key_has_a_meaning():
    """Each key's comment (beside or above its field, in the class that defines it) is its
    meaning on the page: a key without one is a row nobody can act on. The schema as it is now,
    rendered (a comment deleted fails here, before the page is regenerated); the keys walked by
    omegaconf, not by the generator's own row list, so a key it skipped fails too."""
    rows = _rows(config_doc.render())
    leaves = _leaves(OmegaConf.structured(PeerRLConfig))
    blank = sorted(k for k in leaves if not rows.get(k, ["", "", ""])[2])
    assert not blank, (f"schema keys without a meaning (write a comment beside or above the "
                       f"field, then run `python -m peer_rl.config.doc`): {blank}")
    # one inherited field (PolicySettings), one per pool of a shared dataclass (PoolResources)
    assert rows["actor.lr"][2].startswith("AdamW's learning rate")
    assert rows["resources.actor.gpus_per_worker"][2] == rows["resources.rollout.gpus_per_worker"][2]
    assert rows["resources.actor.gpus_per_worker"][2].startswith("GPUs in each worker's bundle")

