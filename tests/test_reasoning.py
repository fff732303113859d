import pytest

from peer_rl.reasoning import (STRATEGIES, format_complete, format_structured, parse_structured,
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
    assert parsed.reply(text) == "the reply"


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
    "Step 1: x Step 2: y Step 3: z Step 4: hi Step 4: again",          # duplicate
    "just a reply with no reasoning",
])
def test_incomplete_outputs(text):
    assert not format_complete(text)


def test_reply_falls_back_to_raw_text_without_step4():
    text = "I hear you."
    assert parse_structured(text).reply(text) == "I hear you."


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
