"""Where a run's checkpoints are and which one `resume=` means.

A checkpoint is `checkpoints/step_N/`: the policy's sharded state (policy/), the trainer state
(STATE_FILE, written last, inside the final rename, so its presence marks a complete
checkpoint) and the ids of the run's prompt pool (PROMPTS_FILE).

A run directory holds one timeline: its checkpoints are the steps of one sequence of updates.
`resume=<checkpoint>` continues that sequence only from its newest checkpoint; one from an
earlier step, or from another run, goes on in a new directory (a branch of its own), so a
resume never cuts back another timeline's metrics nor writes over or prunes its checkpoints
(peer_rl.trainer.run.check_fresh_output)."""
from __future__ import annotations

import re
import shutil
from pathlib import Path

from peer_rl.errors import ConfigError
from peer_rl.files.out_paths import read_json

STATE_FILE = "trainer_state.json"
PROMPTS_FILE = "prompts.json"     # ids of the run's prompt pool, in pool order


def complete_checkpoints(output_dir: Path) -> list[Path]:
    """The complete checkpoints of a run directory, oldest first (numeric order)."""
    return sorted((p for p in (Path(output_dir) / "checkpoints").glob("step_*")
                   if re.fullmatch(r"step_\d+", p.name) and p.is_dir() and not p.is_symlink()
                   and (p / STATE_FILE).exists()), key=lambda p: int(p.name.split("_")[1]))


def latest_checkpoint(output_dir: Path) -> Path | None:
    """The newest complete checkpoint."""
    ckpts = complete_checkpoints(output_dir)
    return ckpts[-1] if ckpts else None


def prune_checkpoints(output_dir: Path, keep: int, upto: int | None = None) -> list[Path]:
    """Delete all but the newest `keep` complete checkpoints at or before step `upto` (the
    step just saved; keep 0: none deleted); returns what was deleted. A later checkpoint is
    never this timeline's to delete; incomplete ones (no state) are not ours to judge."""
    if keep <= 0:
        return []
    ckpts = [p for p in complete_checkpoints(output_dir)
             if upto is None or int(p.name.split("_")[1]) <= upto]
    gone = ckpts[:-keep]
    for p in gone:
        shutil.rmtree(p)
    return gone


def resume_checkpoint(cfg, output_dir: Path) -> Path | None:
    """The checkpoint `resume=` points at: None (disable), the newest complete one (auto), or
    the directory given."""
    if cfg.resume == "disable":
        return None
    if cfg.resume == "auto":
        return latest_checkpoint(Path(output_dir))
    return Path(cfg.resume)


def saved_prompt_selection(checkpoint: Path | None) -> list[str] | None:
    """Ids of the prompt pool a checkpointed run trained on (None: no checkpoint, or one
    written before pools were saved)."""
    path = checkpoint / PROMPTS_FILE if checkpoint is not None else None
    if path is None or not path.exists():
        return None

    return read_json(path, "checkpoint prompt pool")["ids"]


def unseen_files(root: Path, reports: list[dict]) -> list[str]:
    """Files the ranks wrote under `root` (reports: {"rank", "host", "files": {rel: size}})
    that this process does not see at the same size: shards left on another node's disk."""
    out = []
    for rep in reports:
        for rel, size in (rep.get("files") or {}).items():
            p = Path(root) / rel
            if not p.is_file() or p.stat().st_size != size:
                out.append(f"rank {rep['rank']} on {rep['host']}: {rel}")
    return out


def not_shared_error(key: str, path: Path, unseen: list[str]):
    return ConfigError(
        f"{key}={path}: {len(unseen)} file(s) the policy ranks wrote there are not visible to "
        f"the controller (e.g. {unseen[0]}): the directory is on a disk of its own on each "
        "node. Use an absolute path on storage every node mounts (NFS, Lustre, a cloud "
        "bucket mount) for trainer.output_dir.")
