"""Supervised examples: labels only on assistant targets (no loss on prompt tokens), batching."""
import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from peer_rl.config.schema import ConfigError  # noqa: E402
from peer_rl.supervised.config import load_supervised_config  # noqa: E402
from peer_rl.data.bundled import sample_root  # noqa: E402
from peer_rl.supervised.examples import (IGNORE_INDEX, balance_verdicts, batch_indices,  # noqa: E402
                                build_examples, collate, count_targets, load_examples,
                                lr_schedule, rank_rows, target_turns, token_weights,
                                tokenize_chat)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    """The tiny models' real tokenizer (byte-level BPE, Qwen2 chat template); no model weights."""
    from peer_rl.supervised.tiny_models import build_tokenizer

    return build_tokenizer(tmp_path_factory.mktemp("tok"))


def targets_text(tok, ex) -> str:
    return tok.decode([i for i, lab in zip(ex["input_ids"], ex["labels"]) if lab != IGNORE_INDEX])


def runs(labels) -> list[tuple[int, int]]:
    """[start, end) runs of target positions."""
    out, start = [], None
    for i, lab in enumerate(labels + [IGNORE_INDEX]):
        if lab != IGNORE_INDEX and start is None:
            start = i
        elif lab == IGNORE_INDEX and start is not None:
            out.append((start, i))
            start = None
    return out


SER_ROW = {"id": "x", "lang": "en", "messages": [
    {"role": "system", "content": "You judge. True or False appear here too."},
    {"role": "user", "content": "Step 1: the seeker is sad. Is this step correct? True or False."},
    {"role": "assistant", "content": "True"},
    {"role": "user", "content": "Step 2: sentiment negative. True?"},
    {"role": "assistant", "content": "False"},
    {"role": "user", "content": "Step 3: Question. The first sentence is better?"},
    {"role": "assistant", "content": "True"},
    {"role": "user", "content": "First: hi. Second: hello. Which is better?"},
    {"role": "assistant", "content": "The two sentences are almost good"}]}


def test_ser_labels_only_on_the_four_verdicts(tokenizer):
    ex = tokenize_chat(tokenizer, SER_ROW["messages"], target_turns("ser", SER_ROW["messages"]))
    ids, labels = ex["input_ids"], ex["labels"]
    assert len(ids) == len(labels)
    # exactly the verdicts, each followed by the end-of-turn token, and nothing else
    spans = runs(labels)
    assert len(spans) == 4
    eos = tokenizer.eos_token
    assert [tokenizer.decode(ids[a:b]) for a, b in spans] == [
        f"True{eos}", f"False{eos}", f"True{eos}", f"The two sentences are almost good{eos}"]
    # every labelled token is its own input id (teacher forcing), everything else is -100
    assert all(lab in (IGNORE_INDEX, i) for i, lab in zip(ids, labels))
    # the prompt (system + user turns + assistant headers) carries no loss: the words True /
    # False / "better" inside the user turns are not labelled
    prompt = tokenizer.decode([i for i, lab in zip(ids, labels) if lab == IGNORE_INDEX])
    assert "True or False appear here too" in prompt and "Which is better?" in prompt
    assert prompt.count("<|im_start|>assistant\n") == 4
    # the ids are those of the whole rendered chat: what the model sees at inference
    text = tokenizer.apply_chat_template(SER_ROW["messages"], tokenize=False)
    assert ids == tokenizer(text, add_special_tokens=False)["input_ids"]


def test_sft_labels_only_on_the_last_assistant_turn(tokenizer):
    msgs = [{"role": "system", "content": "Be kind."},
            {"role": "user", "content": "I feel low."},
            {"role": "assistant", "content": "An earlier supporter turn."},
            {"role": "user", "content": "Write Step 1..4."},
            {"role": "assistant", "content": "Step 1: Conversation History Analysis.\nsad\n"
                                             "Step 4: Response Generation.\nI'm here."}]
    ex = tokenize_chat(tokenizer, msgs, target_turns("sft", msgs))
    assert targets_text(tokenizer, ex) == msgs[-1]["content"] + tokenizer.eos_token
    assert len(runs(ex["labels"])) == 1
    assert "An earlier supporter turn." not in targets_text(tokenizer, ex)


def test_cold_start_labels_cover_the_reasoning_and_the_reply_not_the_prompt(tokenizer):
    import json

    from peer_rl.data.bundled import sample_root

    rows = [json.loads(x) for x in (sample_root() / "cold_start" / "train.jsonl").open()]
    for row in (rows[0], rows[1]):      # pass 1 and pass 2 of one turn
        msgs = row["messages"]
        ex = tokenize_chat(tokenizer, msgs, target_turns("cold_start", msgs))
        assert msgs[-1]["content"].startswith("<think>")
        assert targets_text(tokenizer, ex) == msgs[-1]["content"] + tokenizer.eos_token
        assert len(runs(ex["labels"])) == 1


def test_sample_rows_targets(tokenizer):
    """On the bundled sample: SER targets are the row's own 4 verdicts (en and zh), SFT targets
    the structured reply; nothing dropped at max_length 1024."""
    from peer_rl.data.loading import load_subset

    ser = load_subset(sample_root(), "ser", "zh/text_train").dataset
    built = build_examples(ser, "ser", tokenizer, max_length=2048)
    assert built.n_too_long == 0 and len(built.examples) == len(ser)
    eos = tokenizer.eos_token
    for row, ex in list(zip(ser, built.examples))[:10]:
        want = "".join(row["messages"][i]["content"] + eos for i in (2, 4, 6, 8))
        assert targets_text(tokenizer, ex) == want
    examples, summary = load_examples(sample_root(), ["sft/textual_train.jsonl"], tokenizer, 1024)
    assert summary["too_long"] == 0 and summary["examples"] == len(examples) > 0
    assert targets_text(tokenizer, examples[0]).startswith("Step 1:")
    # over-long chats are dropped, not truncated
    short = build_examples(ser, "ser", tokenizer, max_length=300)
    assert short.n_too_long > 0
    assert all(len(e["input_ids"]) <= 300 for e in short.examples)
    assert all(len(runs(e["labels"])) == 4 for e in short.examples)


def test_collate_pads_without_labels(tokenizer):
    a = tokenize_chat(tokenizer, SER_ROW["messages"], [8])
    b = {"input_ids": a["input_ids"][:10], "labels": [IGNORE_INDEX] * 9 + [a["input_ids"][9]]}
    batch = collate([a, b], pad_id=0, real=[True, False])
    n = len(a["input_ids"])
    assert batch["input_ids"].shape == (2, n)
    assert batch["attention_mask"][1].tolist() == [1] * 10 + [0] * (n - 10)
    assert (batch["labels"][1] == IGNORE_INDEX).all()           # rank padding row: no loss
    assert batch["labels"][0].tolist() == a["labels"]
    assert count_targets(a) == sum(lab != IGNORE_INDEX for lab in a["labels"][1:])


def test_verdicts_are_balanced_per_position_by_hand():
    # position 0: three True -> one class, weight 3 / (1 x 3) = 1; position 1: False x2, True x1
    # -> False 3 / (2 x 2) = 0.75, True 3 / (2 x 1) = 1.5 (each class totals 1.5)
    examples = [{"verdicts": ["True", "False"]}, {"verdicts": ["True", "True"]},
                {"verdicts": ["True", "False"]}]
    table = balance_verdicts(examples)
    assert [e["turn_weights"] for e in examples] == [[1.0, 0.75], [1.0, 1.5], [1.0, 0.75]]
    assert table == {0: {"True": (3, 1.0)}, 1: {"False": (2, 0.75), "True": (1, 1.5)}}
    assert not any("verdicts" in e for e in examples)


def test_token_weights_follow_the_target_runs():
    labels = [IGNORE_INDEX, 5, 6, IGNORE_INDEX, IGNORE_INDEX, 7, IGNORE_INDEX]
    assert token_weights(labels, [0.5, 2.0]) == [0, 0.5, 0.5, 0, 0, 2.0, 0]
    for wrong in ([0.5], [0.5, 2.0, 1.0]):
        with pytest.raises(ValueError, match="target runs"):
            token_weights(labels, wrong)


def test_balanced_sample_examples_weigh_each_step_label_alike(tokenizer):
    """On the sample's English SER rows: the labels counted from the JSON by hand, each class's
    turns summing to the same weight at a position, and the weights reaching collate's tensor
    and the loss's token count."""
    import json
    from collections import Counter

    examples, summary = load_examples(sample_root(), ["ser/en/text_train.jsonl"], tokenizer,
                                      4096, verdict_balance=True)
    rows = [json.loads(line) for line in
            (sample_root() / "ser/en/text_train.jsonl").read_text().splitlines() if line.strip()]
    first = Counter(next(m["content"] for m in r["messages"] if m["role"] == "assistant")
                    for r in rows)
    assert {k: n for k, (n, _) in summary["verdicts"][0].items()} == dict(first)
    for pos in range(4):
        totals = Counter()
        for label, (n, w) in summary["verdicts"][pos].items():
            totals[label] = n * w
        assert max(totals.values()) == pytest.approx(min(totals.values()))
    ex = next(e for e in examples if len(set(e["turn_weights"][:3])) > 1)
    batch = collate([ex], pad_id=0)
    by_run = [float(batch["weights"][0, a]) for a, _ in runs(ex["labels"])]
    assert by_run == pytest.approx(ex["turn_weights"])
    assert float(batch["weights"][0].sum()) == pytest.approx(
        sum((b - a) * w for (a, b), w in zip(runs(ex["labels"]), ex["turn_weights"])))
    with pytest.raises(ValueError, match="not SER rows"):
        load_examples(sample_root(), ["sft/textual_train.jsonl"], tokenizer, 1024,
                      verdict_balance=True)


def test_verdict_balance_is_refused_for_the_policy_naming_the_key():
    with pytest.raises(ConfigError, match="trainer.verdict_balance"):
        load_supervised_config(["trainer.verdict_balance=true"], "sft")


def test_batches_are_a_function_of_step_and_seed():
    n, bs = 30, 8
    epoch0 = [i for s in range(4) for i in batch_indices(n, bs, s, seed=1)]
    assert sorted(epoch0) == list(range(n))                     # one epoch covers every row once
    assert len(batch_indices(n, bs, 3, seed=1)) == 6            # last batch of the epoch is short
    assert batch_indices(n, bs, 4, seed=1) != batch_indices(n, bs, 0, seed=1)  # new epoch order
    assert batch_indices(n, bs, 5, seed=1) == batch_indices(n, bs, 5, seed=1)
    # the seed matters: another seed orders the same epoch otherwise, still covering every row
    epoch0_seed2 = [i for s in range(4) for i in batch_indices(n, bs, s, seed=2)]
    assert sorted(epoch0_seed2) == list(range(n)) and epoch0_seed2 != epoch0
    assert batch_indices(n, bs, 0, seed=2) != batch_indices(n, bs, 0, seed=1)
    rows, real = rank_rows([5, 6, 7], rank=1, world_size=2)
    assert rows == [6, 5] and real == [True, False]             # padded to ceil(3/2) rows


def test_lr_schedule_warmup_constant_and_cosine_by_hand():
    import torch

    def lrs(steps, start=0, **kw):
        opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=123.0)  # overwritten
        sched = lr_schedule(opt, 1.0, 100, start_step=start, **kw)
        out = []
        for _ in range(steps):
            out.append(opt.param_groups[0]["lr"])
            opt.step()
            sched.step()
        return out

    # linear warmup from 0 over 10 steps (transformers' convention), then flat
    assert lrs(12, warmup_steps=10) == pytest.approx([0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7,
                                                       0.8, 0.9, 1.0, 1.0])
    # cosine from 1 to 0.1 over steps 10..100: halfway (step 55) 0.1 + 0.9 * 0.5 = 0.55
    cos = lrs(101, warmup_steps=10, scheduler="cosine", min_lr_ratio=0.1)
    assert cos[10] == pytest.approx(1.0) and cos[55] == pytest.approx(0.55)
    assert cos[100] == pytest.approx(0.1)
    # a resumed run starts where the uninterrupted one was, with no scheduler state
    assert lrs(3, start=55, warmup_steps=10, scheduler="cosine", min_lr_ratio=0.1) == \
        pytest.approx(cos[55:58])



def test_supervised_config():
    rm = load_supervised_config([], kind="rm")
    assert (rm.recipe, rm.kind, rm.trainer.output_dir) == ("unifireward_tiny", "rm",
                                                           "outputs/unifireward_tiny")
    sft = load_supervised_config(["trainer.lr=1e-4"], kind="sft")
    assert (sft.recipe, sft.kind, sft.trainer.lr) == ("sft_tiny", "sft", 1e-4)
    with pytest.raises(ConfigError, match="model.path: recipe 'unifireward' needs"):
        load_supervised_config(["recipe=unifireward"], kind="rm")
    paper = load_supervised_config(["recipe=unifireward", "model.path=/m"], kind="rm")
    assert paper.trainer.world_size == 8 and paper.resources.gpus_per_worker == 1
    assert load_supervised_config(["recipe=sft", "model.path=/m"], kind="sft").trainer.epochs == 3
    with pytest.raises(ConfigError, match="run it with `peer-rl sft`"):
        load_supervised_config(["recipe=sft"], kind="rm")
    with pytest.raises(ConfigError, match="trainer.batch_size=0"):
        load_supervised_config(["trainer.batch_size=0"], kind="rm")
    with pytest.raises(ConfigError, match="config key 'trainer.lrr'"):
        load_supervised_config(["trainer.lrr=1"], kind="rm")
    with pytest.raises(ConfigError, match=r"'grpo/textual.jsonl': expected a path under sft/ or "
                                          r"cold_start/ relative to data.root \(kind=sft\)"):
        load_supervised_config(["data.train_files=[grpo/textual.jsonl]"], kind="sft")
    with pytest.raises(ConfigError, match=r"expected a path under ser/ relative to data.root "
                                          r"\(kind=rm\)"):
        load_supervised_config(["data.train_files=[sft/textual_train.jsonl]"], kind="rm")


def test_a_visual_ser_row_shows_its_frame_in_the_step2_round_and_expands_it(tokenizer):
    """With a vision-language model the frame goes into the Step 2 user turn (the one the
    RL-time judge shows it in), is expanded to the image's token count, and carries no loss."""
    image = tokenizer.convert_tokens_to_ids("<|image_pad|>")
    start = tokenizer.convert_tokens_to_ids("<|vision_start|>")
    row = {**SER_ROW, "images": ["/data/face.jpg"]}
    plain = build_examples([SER_ROW], "ser", tokenizer, 4096).examples[0]
    seen = []
    built = build_examples([row], "ser", tokenizer, 4096,
                           image_tokens=(image, lambda p: seen.append(p) or 6)).examples[0]
    assert seen == ["/data/face.jpg"] and built["images"] == ["/data/face.jpg"]
    ids, labels = built["input_ids"], built["labels"]
    assert ids.count(image) == 6 and len(ids) == len(plain["input_ids"]) + 6 + 2  # start/end
    first = ids.index(image)
    assert ids[first - 1] == start and all(labels[first + k] == IGNORE_INDEX for k in range(6))
    # the frame sits after the first verdict and before the Step 2 text
    text = tokenizer.decode(ids[:first])
    assert text.count("<|im_start|>user") == 2 and "True<|im_end|>" in text
    # the same four verdicts are the targets as without the image
    assert targets_text(tokenizer, built) == targets_text(tokenizer, plain)
    # without image_tokens (a text-only model) the row trains on its words alone
    assert build_examples([row], "ser", tokenizer, 4096).examples[0]["input_ids"] == \
        plain["input_ids"]


def test_expanding_fewer_placeholders_than_images_is_refused():
    from peer_rl.supervised.examples import expand_image_tokens

    assert expand_image_tokens([1, 9, 2], [-100, -100, 2], 9, [3]) == \
        ([1, 9, 9, 9, 2], [-100, -100, -100, -100, 2])
    with pytest.raises(ValueError, match=r"1 image placeholder\(s\) in the chat for 2 image"):
        expand_image_tokens([1, 9, 2], [-100, -100, 2], 9, [3, 3])


def test_the_prm_and_orm_views_of_a_ser_row(tokenizer):
    """PEER's separate judges learn from the same rows: the PRM the chat through round 3 and its
    three verdicts, the ORM one turn with the history and both replies, and the preference."""
    from peer_rl.data.loading import load_subset
    from peer_rl.prompts.judge import JudgeTemplate
    from peer_rl.supervised.examples import ser_view

    ser = load_subset(sample_root(), "ser", "en/text_train").dataset
    row = dict(ser[0])
    [prm], unread = ser_view([row], "process")
    assert unread == 0 and prm["messages"] == row["messages"][:7]
    ex = build_examples([prm], "ser", tokenizer, 2048).examples[0]
    eos = tokenizer.eos_token
    assert targets_text(tokenizer, ex) == "".join(row["messages"][i]["content"] + eos
                                                  for i in (2, 4, 6))
    [orm], _ = ser_view([row], "outcome", JudgeTemplate())
    history = row["messages"][1]["content"].split("\n\nStep 1 of")[0]    # "Dialogue history:\n..."
    assert [m["role"] for m in orm["messages"]] == ["system", "user", "assistant"]
    assert orm["messages"][1]["content"] == history + "\n\n" + row["messages"][7]["content"]
    ex = build_examples([orm], "ser", tokenizer, 2048).examples[0]
    assert targets_text(tokenizer, ex) == row["messages"][8]["content"] + eos
    # a row the template cannot read back gives the ORM nothing: skipped and counted
    odd = {**row, "messages": [row["messages"][0], {"role": "user", "content": "other words"}]
           + row["messages"][2:]}
    assert ser_view([odd], "outcome", JudgeTemplate()) == ([], 1)


def test_prm_and_orm_recipes_train_on_ser_under_train_rm():
    for recipe, kind in (("prm_tiny", "prm"), ("orm_tiny", "orm")):
        cfg = load_supervised_config([f"recipe={recipe}"], "rm")
        assert cfg.kind == kind and list(cfg.data.train_files) == ["ser/*/*_train.jsonl"]
    with pytest.raises(ConfigError, match="expected a path under ser/"):
        load_supervised_config(["recipe=prm_tiny", "data.train_files=[sft/x.jsonl]"], "rm")
