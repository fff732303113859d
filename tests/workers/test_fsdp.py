"""FSDP2 plumbing that needs no process group: which vision parameters the freeze keeps, the
checkpoint's file index, and the module tree the ranks other than 0 build on the meta device."""
import pytest
import torch

from peer_rl.workers.fsdp import (build_empty, file_index, freeze_vision_tower, load_sharded,
                                   save_sharded, tied_duplicates)


class _Tower(torch.nn.Module):
    """A vision tower shaped like Qwen3-VL's: blocks, the patch merger and the deepstack
    mergers (both aligners), plus a patch embedding."""

    def __init__(self):
        super().__init__()
        self.patch_embed = torch.nn.Linear(4, 4)
        self.blocks = torch.nn.ModuleList([torch.nn.Linear(4, 4) for _ in range(2)])
        self.merger = torch.nn.Linear(4, 8)
        self.deepstack_merger_list = torch.nn.ModuleList([torch.nn.Linear(4, 8)])


class _VL(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.visual = _Tower()
        self.language_model = torch.nn.Linear(8, 8)


def test_the_freeze_keeps_every_aligner_of_the_tower_trainable():
    model = _VL()
    frozen = freeze_vision_tower(model)
    assert sorted(frozen) == ["visual.blocks.0.bias", "visual.blocks.0.weight",
                              "visual.blocks.1.bias", "visual.blocks.1.weight",
                              "visual.patch_embed.bias", "visual.patch_embed.weight"]
    trainable = sorted(n for n, p in model.named_parameters() if p.requires_grad)
    assert trainable == ["language_model.bias", "language_model.weight",
                         "visual.deepstack_merger_list.0.bias",
                         "visual.deepstack_merger_list.0.weight",
                         "visual.merger.bias", "visual.merger.weight"]


def test_a_model_without_a_tower_cannot_be_frozen():
    with pytest.raises(ValueError, match="has no vision tower"):
        freeze_vision_tower(torch.nn.Linear(2, 2))


def test_checkpoint_files_take_consecutive_tensors_up_to_a_ranks_byte_budget():
    """float32: 100 elements are 400 bytes. Budget 1,000 bytes a rank at 2 ranks: 2,000 bytes
    of global tensor a file, a tensor over that alone, the order kept."""
    flat = {"a": torch.zeros(100), "b": torch.zeros(200), "c": torch.zeros(300),   # 400+800+1200
            "d": torch.zeros(600), "e": torch.zeros(10, dtype=torch.float64), "f": torch.zeros(1)}
    assert file_index(flat, world_size=2, per_rank_bytes=1000) == {
        "a": 1, "b": 1,          # 1,200 bytes; + c's 1,200 would pass 2,000
        "c": 2,                  # 1,200; + d's 2,400 would pass
        "d": 3,                  # 2,400 alone (over the budget: a file of its own)
        "e": 4, "f": 4}          # 80 + 4
    assert set(file_index(flat, world_size=1, per_rank_bytes=1 << 30).values()) == {1}


@pytest.mark.parametrize("name", ["policy", "judge"])   # Qwen2.5-VL; Qwen2-VL, renamed at load
def test_a_model_built_on_the_meta_device_is_from_pretrained_s_tree(tiny_models, name):
    """What a rank other than 0 builds (no weight read) against transformers' own load of the
    checkpoint: the state dict's keys in order with their shapes and dtypes, the buffers (rotary
    inv_freq is in no state dict), the tied output layer, the attention implementation and
    eval mode; and nothing in it holds memory."""
    from transformers import AutoModelForImageTextToText

    path = tiny_models[name]
    real = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32).eval()
    empty = build_empty(path)

    def tree(model):
        return ([(k, v.shape, v.dtype) for k, v in model.state_dict().items()],
                [(k, v.shape, v.dtype) for k, v in model.named_buffers()])

    assert tree(empty) == tree(real)
    assert tied_duplicates(empty) == tied_duplicates(real)
    assert empty.config._attn_implementation == real.config._attn_implementation
    assert not empty.training
    assert all(t.is_meta for t in (*empty.parameters(), *empty.buffers()))



def _two_towers():
    torch.manual_seed(0)
    model = torch.nn.ModuleDict({"language": torch.nn.Linear(4, 4),
                                 "visual": torch.nn.Linear(4, 4)})
    return model, torch.optim.AdamW(model.parameters(), lr=0.1)


def _step(model, optim, visual: bool = False):
    x = torch.arange(8.0).reshape(2, 4)
    y = model["language"](x)
    (model["visual"](y) if visual else y).pow(2).sum().backward()
    optim.step()
    optim.zero_grad()


def test_a_parameter_that_never_had_a_gradient_resumes_with_no_steps(tmp_path):
    """A vision-language policy trained on text alone never steps its vision tower, so AdamW
    keeps no state for it: the checkpoint loads anyway, and the tower's first step after it
    is a first step (AdamW's bias correction), as in the run that was not interrupted."""
    model, optim = _two_towers()
    _step(model, optim)
    save_sharded(tmp_path / "ckpt", model, optim, rank=0)
    again, again_optim = _two_towers()
    with torch.no_grad():
        for p in again.parameters():
            p.add_(1.0)                                    # the load must overwrite these
    load_sharded(tmp_path / "ckpt", again, again_optim)
    for (name, p), q in zip(model.named_parameters(), again.parameters()):
        assert torch.equal(p, q), name
    w = again["language"].weight
    assert torch.equal(again_optim.state[w]["exp_avg"], optim.state[model["language"].weight]
                       ["exp_avg"])
    assert again["visual"].weight not in again_optim.state     # as in the saved run
    _step(model, optim, visual=True)            # the tower's first step, after the resume too
    _step(again, again_optim, visual=True)
    for (name, p), q in zip(model.named_parameters(), again.parameters()):
        assert torch.allclose(p, q, atol=1e-7), name
