"""FSDP2 plumbing that needs no process group: which vision parameters the freeze keeps."""
import pytest
import torch

from workers.fsdp import freeze_vision_tower


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
