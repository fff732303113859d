"""ESCRAG-R1's two-pass prompt and its reasoning-response format."""
from peer_rl.prompts.escrag import initial_messages, parse_reasoned, refined_messages

HIST = [{"role": "seeker", "content": "My sister stopped talking to me."}]


def test_the_reply_is_what_follows_the_think_block():
    r = parse_reasoned("<think>stage: exploration; she feels rejected</think>\nThat sounds painful.")
    assert r == ("stage: exploration; she feels rejected", "That sounds painful.", True)
    assert parse_reasoned("<think>only thinking, cut off").reply == ""
    assert parse_reasoned("A plain reply.") == ("", "A plain reply.", False)
    assert not parse_reasoned("<think>a</think>").complete        # nothing after the block
    assert not parse_reasoned("<think>a</think><think>b</think>ok").complete


def test_the_final_pass_sees_dialogue_initial_reply_and_numbered_exemplars():
    msgs = refined_messages(HIST, "en", "I'm sorry.", ["Ex one.", "Ex two."])
    user = msgs[-1]["content"]
    assert "Seeker: My sister stopped talking to me." in user
    assert "Your initial response:\nI'm sorry." in user and "1. Ex one.\n2. Ex two." in user
    assert msgs[0] == initial_messages(HIST, "en")[0]                 # same therapist system
    assert "求助者: My sister" in refined_messages(HIST, "zh", "x", [])[-1]["content"]
