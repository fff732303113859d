"""A seeker token never carries loss: whole conversations (peer_rl.methods.dialogue_rollout) drawn
with a scripted seeker and a policy whose prompts are rendered by the tiny policy's own chat
template, turned into rows (dialogue_turns) and into the update's input (step_batch): the tokens
under the response mask decode to the policy's own answers, and every seeker line lies in the
masked-out context of the turns after it."""
import numpy as np
from transformers import AutoTokenizer

from peer_rl.methods.dialogue_rollout import SeekerProfile, dialogue, run_dialogues
from peer_rl.methods.dialogue_turns import turn_samples
from peer_rl.prompts.policy import PolicyTemplate
from peer_rl.protocol import Sample
from peer_rl.trainer.step_batch import update_batch
from peer_rl.trainer.tiny_cache import SHIPPED_DIR

TOKENIZER = AutoTokenizer.from_pretrained(SHIPPED_DIR / "policy")


def policy(requests):
    """The supporter: its prompt the template's chat as an engine renders it, its answer
    Steps 1-4 (the reasoning stays with the policy: the seeker reads Step 4)."""
    out = []
    for messages in requests:
        prompt = TOKENIZER.apply_chat_template(messages, add_generation_prompt=True,
                                               tokenize=True, return_dict=False)
        n = sum(m["role"] == "user" for m in messages) + len(out)
        text = (f"Step 1: history {n}\nStep 2: tired\nStep 3: reflect\n"
                f"Step 4: supporter says {n}")
        ids = TOKENIZER(text, add_special_tokens=False)["input_ids"]
        out.append(Sample(uid=-1, prompt_ids=list(prompt), response_ids=ids,
                          response_logprobs=[-1.0] * len(ids), text=text))
    return out


def seeker(requests):
    return ['{"change": 2, "reaction": "a little better"}' if schema else
            "seeker line zebra" for _, schema in requests]


def test_the_loss_covers_the_policys_tokens_and_never_the_seekers():
    profiles = [SeekerProfile(f"p{i}", f"You are seeker {i}.", f"opening words {i}", "en")
                for i in range(2)]
    dialogues = run_dialogues([dialogue(i, p, PolicyTemplate(), max_turns=3)
                               for i, p in enumerate(profiles)],
                              {"policy": policy, "seeker": seeker})
    samples = turn_samples(dialogues)
    assert [len(d.turns) for d in dialogues] == [3, 3]
    batch = update_batch(samples, np.ones(len(samples)))
    for row, sample in enumerate(samples):
        trained = batch.input_ids[row][batch.response_mask[row] == 1]
        context = batch.input_ids[row][(batch.response_mask[row] == 0)
                                       & (batch.attention_mask[row] == 1)]
        # exactly the policy's answer is trained, and none of it is the seeker's
        assert TOKENIZER.decode(trained) == sample.text
        assert "zebra" not in TOKENIZER.decode(trained)
        assert "opening words" in TOKENIZER.decode(context)
    # turn t's context holds the seeker's t - 1 lines so far (and the policy's earlier Step 4s)
    for t in range(3):
        context = TOKENIZER.decode(batch.input_ids[t][:len(samples[t].prompt_ids)])
        assert context.count("seeker line zebra") == t
        assert context.count("supporter says") == t and "Step 2: tired" not in context
