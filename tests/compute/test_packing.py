"""Packed rows (peer_rl.compute.packing): layouts worked out by hand, and the segment attention
against a second, naive implementation of per-row causal attention."""
import math

import pytest
import torch

from peer_rl.compute import packing


def test_layout_pack_and_unpack_by_hand():
    attn = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]])
    lay = packing.layout(attn)
    assert lay.index.tolist() == [0, 1, 2, 4, 5, 8, 9, 10, 11]
    assert lay.positions.tolist() == [0, 1, 2, 0, 1, 0, 1, 2, 3]
    assert lay.tokens == 9 and lay.shape == (3, 4)
    ids = torch.tensor([[11, 12, 13, 0], [21, 22, 0, 0], [31, 32, 33, 34]])
    assert packing.pack(ids, lay).tolist() == [[11, 12, 13, 21, 22, 31, 32, 33, 34]]
    back = packing.unpack(torch.arange(1.0, 10.0)[None], lay)
    assert back.tolist() == [[1, 2, 3, 0], [4, 5, 0, 0], [6, 7, 8, 9]]
    # trailing dimensions travel with their token
    h = torch.arange(24.0).view(3, 4, 2)
    assert packing.pack(h, lay)[0, 3].tolist() == [8.0, 9.0]       # row 1, column 0


def test_unpack_passes_gradients_to_the_real_tokens_only():
    lay = packing.layout(torch.tensor([[1, 1, 0], [1, 0, 0]]))
    y = torch.ones(1, 3, requires_grad=True)
    (packing.unpack(y, lay) * torch.tensor([[1.0, 2.0, 5.0], [3.0, 7.0, 9.0]])).sum().backward()
    assert y.grad.tolist() == [[1.0, 2.0, 3.0]]


@pytest.mark.parametrize("mask", [[[0, 1, 1]], [[1, 0, 1]]])
def test_rows_that_are_not_right_padded_are_refused(mask):
    with pytest.raises(ValueError, match="attention_mask row 0: expected right padding"):
        packing.layout(torch.tensor(mask))


def test_segments_start_where_positions_restart():
    assert packing.segments(torch.tensor([[0, 1, 2, 0, 1, 0]])) == [(0, 3), (3, 5), (5, 6)]
    with pytest.raises(ValueError, match="must start at 0"):
        packing.segments(torch.tensor([[1, 2, 0]]))


def naive_causal(q, k, v, scale):
    """One row's causal attention written out: softmax over the keys at or before each query."""
    H, L, D = q.shape
    out = torch.zeros_like(q)
    for h in range(H):
        for i in range(L):
            w = torch.stack([(q[h, i] * k[h, j]).sum() * scale for j in range(i + 1)])
            out[h, i] = (torch.softmax(w, 0)[:, None] * v[h, :i + 1]).sum(0)
    return out


class _Attn(torch.nn.Module):
    is_causal = True

    def __init__(self, groups: int):
        super().__init__()
        self.num_key_value_groups = groups


@pytest.mark.parametrize("kv_heads", [4, 2])
def test_each_packed_row_attends_to_itself_alone(kv_heads):
    """Rows of 3, 1 and 4 tokens in one packed row (4 query heads; 2 key/value heads is
    grouped-query attention): each row's output is its own causal attention."""
    torch.manual_seed(0)
    lengths, D = [3, 1, 4], 8
    T = sum(lengths)
    q = torch.randn(1, 4, T, D)
    k, v = torch.randn(1, kv_heads, T, D), torch.randn(1, kv_heads, T, D)
    pos = torch.cat([torch.arange(n) for n in lengths])[None]
    out, _ = packing.varlen_sdpa(_Attn(4 // kv_heads), q, k, v, None, scaling=1 / math.sqrt(D),
                                 position_ids=pos)
    assert out.shape == (1, T, 4, D)
    rep = 4 // kv_heads
    start = 0
    for n in lengths:
        s = slice(start, start + n)
        want = naive_causal(q[0, :, s], k[0, :, s].repeat_interleave(rep, 0),
                            v[0, :, s].repeat_interleave(rep, 0), 1 / math.sqrt(D))
        torch.testing.assert_close(out[0, s].transpose(0, 1), want, atol=1e-5, rtol=1e-5)
        start += n
    # one causal attention over the whole packed row would let later rows see earlier ones
    whole, _ = packing.varlen_sdpa(_Attn(4 // kv_heads), q, k, v, None, scaling=1 / math.sqrt(D),
                                   position_ids=torch.arange(T)[None])
    assert (whole[0, 3:] - out[0, 3:]).abs().max() > 1e-2


def test_a_registered_model_runs_packed_as_padded():
    """A small Llama (1-D RoPE, SmolLM2's architecture) loaded with the registered attention:
    two rows packed with their own positions give the padded forward's logits."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, vocab_size=50)
    model = LlamaForCausalLM(cfg).eval()
    ids = torch.tensor([[5, 6, 7, 8, 9], [11, 12, 13, 0, 0]])
    attn = (ids > 0).long()
    padded = model(input_ids=ids, attention_mask=attn).logits
    model.set_attn_implementation(packing.register())
    lay = packing.layout(attn)
    pos = packing.position_ids(model, ids, attn, lay)
    assert pos.tolist() == [[0, 1, 2, 3, 4, 0, 1, 2]]
    out = model(input_ids=packing.pack(ids, lay), position_ids=pos).logits
    torch.testing.assert_close(packing.unpack(out, lay)[attn.bool()], padded[attn.bool()],
                               atol=1e-5, rtol=1e-5)
