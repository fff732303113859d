import pytest

from peer_rl.prompts.reasoning import (STRATEGIES, format_complete, format_structured, parse_structured,
                               policy_messages, step_marker)


def test_canonical_markers():
    assert step_marker(4, "en") == "Step 4: Response Generation."
    assert step_marker(4, "zh") == "步骤4： 回复生成。"


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_roundtrip_canonical_layout(lang):
    text = format_structured(["a", "b", "c", "the reply"], lang)
    parsed = parse_structured(text)
    assert parsed.complete
    assert parsed.steps == {1: "a", 2: "b", 3: "c", 4: "the reply"}
    assert parsed.reply == "the reply"


@pytest.mark.parametrize("text", [
    "Step 1: x\nStep 2: y\nStep 3: z\nStep 4: Response Generation. hi",
    "step1：x step2: y Step 3 : z Step 4： Response Generation. hi",
    "步骤1：x\n步骤2:y\n步骤 3：z\n步骤4： 回复生成。你好",
    "步骤1: x 步骤2： y 步骤3： z 步骤4：回复生成。你好",
])
def test_marker_variants_are_complete(text):
    assert format_complete(text)


@pytest.mark.parametrize("text", [
    "Step 1: x\nStep 2: y\nStep 4: Response Generation. hi",          # missing step
    "Step 2: y\nStep 1: x\nStep 3: z\nStep 4: Response Generation. hi",  # out of order
    "Step 1: x\nStep 2: y\nStep 3: z\nStep 4: Response Generation.",     # empty reply
    "Step 1:\nStep 2: y\nStep 3: z\nStep 4: hi",                       # empty step 1
    "Step 1: x Step 2: y Step 2: y2 Step 3: z Step 4: hi",             # duplicate
    "just a reply with no reasoning",
])
def test_incomplete_outputs(text):
    assert not format_complete(text)


R = "That sounds exhausting. What weighs on you most?"
ZH = "听起来你很累。"

# (model output, the reply the judge, RUR and the seeker see, format complete), written by hand
READINGS = [
    # Markdown around the labels
    ("Step 1: x\nStep 2: y\nStep 3: z\n**Step 4:** Response Generation. " + R, R, True),
    ("**Step 1: Conversation History Analysis**\nx\n**Step 2: Emotional State Inference**\ny\n"
     "**Step 3: Strategy Selection**\nz\n**Step 4: Response Generation**\n" + R, R, True),
    ("### Step 1\nx\n### Step 2\ny\n### Step 3\nz\n### Step 4\n" + R, R, True),
    ("- **Step 1 (Conversation History Analysis):** x\n- **Step 2 (Emotional State Inference):** y"
     "\n- **Step 3 (Strategy Selection):** z\n- **Step 4 (Response Generation):** " + R, R, True),
    # separators other than a colon, at a line's start
    ("Step 1 - Conversation History Analysis: x\nStep 2 - Emotional State Inference: y\n"
     "Step 3 - Strategy Selection: z\nStep 4 - Response Generation: " + R, R, True),
    ("Step 1 — x\nStep 2 — y\nStep 3 — z\nStep 4 — " + R, R, True),
    ("Step 1. x\nStep 2. y\nStep 3. z\nStep 4. Response Generation. " + R, R, True),
    # Chinese labels: 第N步, 步骤N in bold, a space before the title
    ("第一步：对话历史分析。x\n第二步：情绪状态推断。y\n第三步：策略选择。z\n第四步：回复生成。" + ZH,
     ZH, True),
    ("**步骤1：对话历史分析**\nx\n**步骤2：情绪状态推断**\ny\n**步骤3：策略选择**\nz\n"
     "**步骤4：回复生成**\n" + ZH, ZH, True),
    ("第1步 对话历史分析\nx\n第2步 情绪状态推断\ny\n第3步 策略选择\nz\n第4步 回复生成\n" + ZH,
     ZH, True),
    # a step label inside the reply is the reply's own text
    ("Step 1: x\nStep 2: y\nStep 3: Providing Suggestions\nStep 4: Response Generation. "
     "Let's try something small.\nStep 1: breathe slowly.\nStep 2: write one worry down.",
     "Let's try something small.\nStep 1: breathe slowly.\nStep 2: write one worry down.", True),
    ("步骤1：x\n步骤2：y\n步骤3：z\n步骤4：回复生成。我们一步步来。\n步骤1：深呼吸。\n步骤2：写下一件担心的事。",
     "我们一步步来。\n步骤1：深呼吸。\n步骤2：写下一件担心的事。", True),
    ("Step 1: x\nStep 2: y\nStep 3: z\nStep 4: " + R + " Maybe step 1: rest tonight.",
     R + " Maybe step 1: rest tonight.", True),
    # a think block is not the output
    ("<think>Step 1: draft\nStep 4: draft reply</think>\nStep 1: x\nStep 2: y\nStep 3: z\n"
     "Step 4: " + R, R, True),
    # no Step 4: the last labelled step's body (training and evaluation alike), or everything
    ("Step 1: x\nStep 2: y\nStep 3: Question. " + R, "Question. " + R, False),
    ("Step 1: x\nStep 2: y\nStep 3: z\nStep 4: Response Generation.", "", False),
]


@pytest.mark.parametrize("text,reply,complete", READINGS)
def test_one_reading_of_the_reply(text, reply, complete):
    parsed = parse_structured(text)
    assert parsed.reply == reply
    assert parsed.complete is complete


@pytest.mark.parametrize("text,reply,complete", READINGS + [("I hear you.", "I hear you.", False)])
def test_evaluation_shows_the_reply_training_judges(text, reply, complete):
    """The seeker in an evaluation reads what the judge and RUR read in training."""
    from peer_rl.evaluation.supporter import shown_reply
    shown, step4 = shown_reply(text, "peer")
    assert shown == reply == parse_structured(text).reply
    assert step4 is bool(parse_structured(text).steps.get(4))


def test_the_whole_output_is_the_reply_without_any_label():
    assert parse_structured("I hear you.").reply == "I hear you."
    assert not parse_structured("Step 10: x").steps          # not a step label


@pytest.mark.parametrize("lang", ["en", "zh"])
@pytest.mark.parametrize("visual", [False, True])
def test_policy_messages_name_all_strategies_and_history(lang, visual):
    history = [{"role": "seeker", "content": "I lost my job"}]
    msgs = policy_messages(history, lang, visual)
    assert [m["role"] for m in msgs] == ["system", "user"]
    assert "I lost my job" in msgs[1]["content"]
    assert all(s in msgs[1]["content"] for s in STRATEGIES)
    assert step_marker(4, lang).split()[0] in msgs[1]["content"]


def test_policy_messages_rejects_unknown_language():
    with pytest.raises(ValueError, match="unsupported language 'fr'"):
        policy_messages([], "fr")
