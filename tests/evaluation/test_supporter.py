"""What the model under test is asked, and what of its answer the seeker reads."""
from peer_rl.evaluation.supporter import chat_messages, shown_reply, supporter_request

STRUCTURED = ("Step 1: Conversation History Analysis.\nx\nStep 2: Emotional State Inference.\ny\n"
              "Step 3: Strategy Selection.\nQuestion\nStep 4: Response Generation.\nI'm here.")


def test_peer_style_shows_step_4_only():
    assert shown_reply(STRUCTURED, "peer") == ("I'm here.", True)
    # no Step 4: the seeker sees the text after the last marker, the turn is a format miss
    assert shown_reply("Step 1: x\nStep 2: sad, tired", "peer") == ("sad, tired", False)
    assert shown_reply("Just a plain reply.", "peer") == ("Just a plain reply.", False)


def test_chat_style_shows_everything_but_a_think_block():
    assert shown_reply("<think>hmm</think> Sounds hard.", "chat") == ("Sounds hard.", None)
    assert shown_reply(STRUCTURED, "chat")[0] == STRUCTURED


def test_chat_messages_alternate_and_merge_consecutive_seeker_turns():
    msgs = chat_messages([{"role": "seeker", "content": "a"}, {"role": "seeker", "content": "b"},
                          {"role": "supporter", "content": "c"}, {"role": "seeker", "content": "d"}],
                         "en")
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user"]
    assert msgs[1]["content"] == "a\nb"


def test_peer_requests_use_the_training_prompt_and_attach_images():
    req = supporter_request("peer", [{"role": "seeker", "content": "I failed."}], "en",
                            images=["/f1.png", "/f2.png"], n=3)
    assert req.n == 3 and "Step 4: Response Generation." in str(req.messages)
    parts = req.messages[-1]["content"]
    assert [p["type"] for p in parts] == ["image", "image", "text"]
    given = [{"role": "user", "content": "row prompt"}]
    assert supporter_request("peer", [], "en", messages=given).messages == given
