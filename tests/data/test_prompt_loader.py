import pytest

from peer_rl.trainer.checkpoints import latest_checkpoint
from peer_rl.protocol import shard
from peer_rl.data.prompt_loader import Cursor, PromptLoader


def test_resumed_cursor_replays_the_same_order():
    rows = [{"i": i} for i in range(10)]
    a = PromptLoader(rows, 3, seed=1)
    seen = [[r["i"] for r in a.next_batch()] for _ in range(5)]  # crosses an epoch boundary
    b = PromptLoader(rows, 3, seed=1)
    b.next_batch(), b.next_batch()
    c = PromptLoader(rows, 3, seed=1, cursor=Cursor(**b.cursor.state()))
    assert [[r["i"] for r in c.next_batch()] for _ in range(3)] == seen[2:]
    assert len(set(sum(seen[:3], []))) == 9  # epoch 0: no repeats; the tail of 1 is dropped


def test_a_pool_that_is_a_multiple_of_the_batch_serves_every_batch_of_each_epoch():
    """The paper's recipe has 3,000 prompts and batches of 24: no tail. Here 6 prompts, batches
    of 3, seed 1; the module's order is numpy's default_rng([seed, epoch]).permutation(6):
    epoch 0 [4, 0, 2, 1, 5, 3], epoch 1 [1, 4, 0, 3, 2, 5], epoch 2 [4, 5, 1, 0, 3, 2]."""
    import numpy as np

    orders = [[4, 0, 2, 1, 5, 3], [1, 4, 0, 3, 2, 5], [4, 5, 1, 0, 3, 2]]
    assert [np.random.default_rng([1, e]).permutation(6).tolist() for e in range(3)] == orders
    rows = [{"i": i} for i in range(6)]
    a = PromptLoader(rows, 3, seed=1)
    seen, cursors = [], []
    for _ in range(5):
        seen.append([r["i"] for r in a.next_batch()])
        cursors.append(a.cursor.state())
    assert seen == [[4, 0, 2], [1, 5, 3], [1, 4, 0], [3, 2, 5], [4, 5, 1]]
    assert [(c["epoch"], c["position"]) for c in cursors] == [(0, 3), (0, 6), (1, 3), (1, 6),
                                                              (2, 3)]
    # resumed at the boundary (the cursor a checkpoint after epoch 0's last batch saves)
    b = PromptLoader(rows, 3, seed=1, cursor=Cursor(epoch=0, position=6))
    assert [[r["i"] for r in b.next_batch()] for _ in range(3)] == [[1, 4, 0], [3, 2, 5],
                                                                    [4, 5, 1]]


def test_batch_larger_than_data_is_refused():
    with pytest.raises(ValueError, match="train_batch_size=5 exceeds the 2"):
        PromptLoader([{}, {}], 5)


def test_shard_keeps_order_and_balance():
    assert shard(list(range(7)), 3) == [[0, 1, 2], [3, 4], [5, 6]]
    assert shard([1], 2) == [[1], []]


def test_latest_checkpoint_ignores_incomplete(tmp_path):
    ck = tmp_path / "checkpoints"
    for name, complete in (("step_2", True), ("step_10", True), ("step_12.tmp", True),
                           ("step_11", False)):
        (ck / name).mkdir(parents=True)
        if complete:
            (ck / name / "trainer_state.json").write_text("{}")
    assert latest_checkpoint(tmp_path).name == "step_10"
    assert latest_checkpoint(tmp_path / "none") is None


def test_a_drawn_pool_is_restored_from_the_checkpoint_not_redrawn(tmp_path):
    import json

    from peer_rl.config.schema import load_config
    from peer_rl.trainer.checkpoints import PROMPTS_FILE, saved_prompt_selection
    from peer_rl.trainer.run import load_prompts

    over = ["data.train_files=[grpo/textual.jsonl,grpo/visual.jsonl]", "data.prompts_per_file=[5,3]"]
    pool = load_prompts(load_config(over + ["data.seed=1"]))
    assert [r["modality"] for r in pool] == ["text"] * 5 + ["visual"] * 3
    other = load_prompts(load_config(over + ["data.seed=2"]))
    assert [r["id"] for r in other] != [r["id"] for r in pool]
    ckpt = tmp_path / "step_4"
    ckpt.mkdir()
    (ckpt / PROMPTS_FILE).write_text(json.dumps({"ids": [r["id"] for r in pool]}))
    restored = load_prompts(load_config(over + ["data.seed=2"]), saved_prompt_selection(ckpt))
    assert restored == pool
    assert saved_prompt_selection(tmp_path) is None and saved_prompt_selection(None) is None
