"""Placing a row's images in its chat: tags in place, otherwise before one chosen turn."""
import pytest

from peer_rl.prompts.multimodal import attach_images, count_tags, image_paths, strip_tags

SYS = {"role": "system", "content": "s"}


def test_untagged_images_go_before_the_last_user_turn():
    msgs = [SYS, {"role": "user", "content": "first"}, {"role": "assistant", "content": "a"},
            {"role": "user", "content": "how do I look?"}]
    out = attach_images(msgs, ["f1.jpg", "f2.jpg"])
    assert out[:3] == msgs[:3]
    assert out[3]["content"] == [{"type": "image", "image": "f1.jpg"},
                                 {"type": "image", "image": "f2.jpg"},
                                 {"type": "text", "text": "how do I look?"}]
    assert msgs[3]["content"] == "how do I look?"          # the row itself is not changed


def test_untagged_images_go_to_a_chosen_turn():
    msgs = [SYS] + [{"role": r, "content": c} for r, c in
                    (("user", "step 1"), ("assistant", "True"), ("user", "step 2"))]
    out = attach_images(msgs, ["face.jpg"], turn=3)
    assert out[1]["content"] == "step 1"
    assert out[3]["content"][0] == {"type": "image", "image": "face.jpg"}


def test_tags_place_images_where_they_stand():
    msgs = [{"role": "user", "content": "<image>Frame A. Then <image> frame B."}]
    out = attach_images(msgs, ["a.jpg", "b.jpg"])
    assert out[0]["content"] == [{"type": "image", "image": "a.jpg"},
                                 {"type": "text", "text": "Frame A. Then "},
                                 {"type": "image", "image": "b.jpg"},
                                 {"type": "text", "text": " frame B."}]
    assert image_paths(out) == ["a.jpg", "b.jpg"]


def test_a_tag_count_that_disagrees_with_the_images_is_refused():
    with pytest.raises(ValueError, match=r"1 <image> tag\(s\) for 2 image\(s\)"):
        attach_images([{"role": "user", "content": "<image> hi"}], ["a.jpg", "b.jpg"])


def test_text_only_drops_the_tags():
    msgs = [{"role": "user", "content": "<image><image>I'm fine."}]
    assert count_tags(msgs) == 2
    assert strip_tags(msgs) == [{"role": "user", "content": "I'm fine."}]
    assert attach_images(msgs, []) == [{"role": "user", "content": "I'm fine."}]
