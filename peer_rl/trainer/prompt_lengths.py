"""The training prompts' lengths in the policy's tokens, as the rollout engine will see them:
checked against rollout.max_model_len before any pool starts (a prompt that leaves no room for
the reply is named, not met mid-run as an engine error), and used to size the rollout engine's
KV cache for the longest row the data can bring."""
from __future__ import annotations

from peer_rl.config.schema import ConfigError
from peer_rl.prompts.multimodal import attach_images, is_vision_language, strip_tags


def load_processors(policy_path: str):
    """The policy's tokenizer and, for a vision-language policy, its image processor
    (peer_rl.workers.vision.VisionInputs), as the rollout and the policy ranks will load them: a model
    directory without them is named (ConfigError) before any pool starts."""
    from transformers import AutoTokenizer  # deferred: transformers (~3 s, pulls in torch)

    try:
        tokenizer = AutoTokenizer.from_pretrained(policy_path)
        if not is_vision_language(policy_path):
            return tokenizer, None
        from peer_rl.workers.vision import VisionInputs  # deferred: pulls in torch

        return tokenizer, VisionInputs(policy_path)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"model.path={policy_path!r}: its tokenizer or image processor does "
                          f"not load ({str(exc).splitlines()[0]})") from None


def prompt_lengths(rows: list[dict], policy_path: str) -> list[int]:
    """Tokens of each row's chat with the generation prompt; a vision-language policy's images
    count as the tokens its processor expands them into (each image's placeholder pad becomes
    grid_t x grid_h x grid_w / merge_size^2 pads), a text-only policy's as nothing (it reads
    the words alone)."""
    tokenizer, vision = load_processors(policy_path)
    out = []
    for row in rows:
        images = list(row.get("images") or []) if vision is not None else []
        messages = (attach_images(row["messages"], images) if images
                    else strip_tags(row["messages"]))
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                            return_dict=False)
        out.append(len(ids) + sum(vision.tokens(p) - 1 for p in images))
    return out


def check_prompt_room(rows: list[dict], lengths: list[int], max_model_len: int,
                      response_length: int) -> None:
    """Every prompt leaves rollout.response_length tokens of rollout.max_model_len for its reply."""
    room = max_model_len - response_length
    over = [(n, r) for n, r in zip(lengths, rows) if n > room]
    if over:
        n, row = max(over, key=lambda x: x[0])
        where = row.get("id") or row.get("uid") or "?"
        raise ConfigError(
            f"{len(over)} training prompt(s) longer than rollout.max_model_len - "
            f"rollout.response_length = {max_model_len} - {response_length} = {room} tokens; "
            f"the longest, row id {where!r}, is {n} tokens. Raise rollout.max_model_len, lower "
            "rollout.response_length, or drop those rows from the data")
