"""Shared-prefix packing (peer_rl.compute.shared_prefix, packing.blocks / predictions): trees,
layouts and pairs worked out by hand; a small Llama run with shared prefixes against the same
rows run padded by transformers' own attention: equal log-probs and gradients in float32."""
import math

import pytest
import torch

from peer_rl.compute import packing, shared_prefix
from peer_rl.compute.shared_prefix import Tree
from peer_rl.config.worker_settings import shared_prefix_on


def test_rows_alike_form_one_tree_and_the_prefix_is_what_they_all_share():
    # sorted: rows 0 and 3 (1 2 3 4), row 1 (1 2 3 5), row 2 (9 9); one run of 0, 3, 1 saves
    # 2 x 3 = 6 tokens, runs {0, 3} + {1} save 4: the first wins
    got = shared_prefix.trees([[1, 2, 3, 4], [1, 2, 3, 5], [9, 9], [1, 2, 3, 4]])
    assert got == [Tree((0, 3, 1), 3), Tree((2,), 0)]
    assert shared_prefix.saved_tokens(got) == 6


def test_two_groups_under_one_system_prompt_share_their_own_prompts():
    # all four share [7, 7] (3 x 2 = 6 saved as one run); each pair shares 6 tokens (5 + 5 = 10)
    a, b = [7, 7, 1, 1, 1, 1], [7, 7, 2, 2, 2, 2]
    got = shared_prefix.trees([b, a, b[:5] + [3], a[:5] + [4]])
    assert got == [Tree((1, 3), 5), Tree((0, 2), 5)]
    # rows with nothing in common are each their own tree
    assert shared_prefix.trees([[1], [2], [3]]) == [Tree((0,), 0), Tree((1,), 0), Tree((2,), 0)]


def test_layout_runs_the_prefix_once_and_points_shared_tokens_at_the_trunk():
    ids = torch.tensor([[1, 2, 3, 7, 8], [1, 2, 3, 9, 0], [5, 6, 0, 0, 0]])
    attn = (ids > 0).long()
    lay, chosen = shared_prefix.layout(ids, attn, [3, 3, 1])
    assert chosen == [Tree((0, 1), 3), Tree((2,), 0)]
    assert lay.index.tolist() == [0, 1, 2, 3, 4, 8, 10, 11]
    assert lay.positions.tolist() == [0, 1, 2, 3, 4, 3, 0, 1]
    assert lay.source.view(3, 5).tolist() == [[0, 1, 2, 3, 4], [0, 1, 2, 5, -1],
                                              [6, 7, -1, -1, -1]]
    assert packing.pack(ids, lay).tolist() == [[1, 2, 3, 7, 8, 9, 5, 6]]
    pred = packing.predictions(ids, lay)
    # (state, label): row 0 (0,2) (1,3) (2,7) (3,8); row 1 (0,2) (1,3) (2,9); row 2 (6,6)
    assert list(zip(pred.states.tolist(), pred.labels.tolist())) == [
        (0, 2), (1, 3), (2, 7), (2, 9), (3, 8), (6, 6)]
    assert pred.inverse.tolist() == [[-1, 0, 1, 2, 4], [-1, 0, 1, 3, -1], [-1, 5, -1, -1, -1]]


def test_a_row_keeps_a_token_of_its_own_whatever_it_may_share():
    ids = torch.tensor([[4, 5, 6], [4, 5, 6]])
    lay, chosen = shared_prefix.layout(ids, torch.ones_like(ids), [3, 3])
    assert chosen == [Tree((0, 1), 2)]
    assert lay.positions.tolist() == [0, 1, 2, 2]


def test_blocks_read_trunks_and_branches_from_the_positions():
    pos = torch.tensor([[0, 1, 2, 3, 0, 1, 2, 3, 4, 2, 3, 0, 1]])
    assert packing.blocks(pos) == [(0, 4, 0, 0), (4, 9, 4, 0), (9, 11, 4, 2), (11, 13, 11, 0)]
    with pytest.raises(ValueError, match="branch at token 2 continues position 3, past its "
                                         "trunk's 2 tokens"):
        packing.blocks(torch.tensor([[0, 1, 3]]))


def test_prompt_lengths_end_at_the_first_response_token():
    resp = torch.tensor([[0, 0, 1, 1], [0, 0, 0, 0], [0, 1, 0, 0]])
    attn = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 0, 0]])
    assert shared_prefix.prompt_lengths(resp, attn).tolist() == [2, 3, 1]


@pytest.mark.parametrize("setting,packed,on", [
    ("auto", True, True), ("auto", False, False), ("false", True, False), ("true", True, True)])
def test_auto_is_on_where_supported(setting, packed, on):
    assert shared_prefix_on(setting, packed) is on


def test_true_where_unsupported_names_the_key():
    with pytest.raises(ValueError, match="actor.shared_prefix=true: not with "
                                         "actor.use_remove_padding=false"):
        shared_prefix_on("true", False)


class _Attn(torch.nn.Module):
    is_causal = True
    num_key_value_groups = 1


def naive(q, k, v, allowed, scale):
    """softmax over the allowed keys of each query, written out (H, Tq, D)."""
    w = torch.einsum("hqd,hkd->hqk", q, k) * scale
    w = w.masked_fill(~allowed, float("-inf"))
    return torch.einsum("hqk,hkd->hqd", torch.softmax(w, -1), v)


def test_a_branch_attends_to_the_shared_prefix_and_to_itself_alone():
    """Trunk of 5 (prefix 3 + 2 own), a branch of 2 at position 3, a branch of 3 at position 3:
    each branch's queries see the 3 prefix keys and their own keys causally, never the trunk's
    own tokens or the other branch's."""
    torch.manual_seed(0)
    pos = torch.tensor([[0, 1, 2, 3, 4, 3, 4, 3, 4, 5]])
    T, D = pos.shape[1], 8
    q, k, v = (torch.randn(1, 2, T, D) for _ in range(3))
    out, _ = packing.varlen_sdpa(_Attn(), q, k, v, None, scaling=1 / math.sqrt(D),
                                 position_ids=pos)
    rows = {"trunk": list(range(0, 5)), "b1": [0, 1, 2, 5, 6], "b2": [0, 1, 2, 7, 8, 9]}
    for name, idx in rows.items():
        n = len(idx)
        want = naive(q[0][:, idx], k[0][:, idx], v[0][:, idx],
                     torch.ones(n, n, dtype=torch.bool).tril(), 1 / math.sqrt(D))
        own = idx if name == "trunk" else idx[3:]
        torch.testing.assert_close(out[0, own].transpose(0, 1), want[:, -len(own):],
                                   atol=1e-5, rtol=1e-5)


def _llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, vocab_size=60)
    return LlamaForCausalLM(cfg).eval()


def _grouped():
    """Two groups of three replies to one prompt (prompts of 6 and 4 tokens) and a row alone."""
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(1, 60, (6,), generator=g), torch.randint(1, 60, (4,), generator=g)]
    rows, share = [], []
    for p, n in ((prompts[0], 3), (prompts[1], 3), (torch.randint(1, 60, (5,), generator=g), 1)):
        for _ in range(n):
            reply = torch.randint(1, 60, (int(torch.randint(1, 6, (1,), generator=g)),),
                                  generator=g)
            rows.append(torch.cat([p, reply]))
            share.append(len(p))
    L = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), L, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, :len(r)] = r
    return ids, (ids > 0).long(), share


@pytest.mark.parametrize("path", ["sdpa", "flex"])
def test_a_model_run_with_shared_prefixes_gives_the_padded_log_probs_and_gradients(
        path, monkeypatch, dynamo_on):
    """Float32: the shared run's log-probs of every token equal those of the padded rows
    under transformers' own masked attention, and so do the gradients of a weighted sum over
    the replies' tokens (the flex path, packing.attention_path's choice on CUDA, runs eagerly
    here, where PyTorch has no flex_attention backward: its log-probs only). A row that could
    see another row's tokens would fail here."""
    monkeypatch.setattr(packing, "FORCE_PATH", path)
    ids, attn, share = _grouped()
    model = _llama()
    resp = torch.zeros_like(ids, dtype=torch.float32)
    for i, p in enumerate(share):
        resp[i, p:int(attn[i].sum())] = 1.0
    weights = torch.linspace(-1.0, 1.5, ids.numel()).view(ids.shape) * resp

    logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1]
    padded = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None])[..., 0]
    padded = torch.nn.functional.pad(padded, (1, 0)) * attn
    (padded * weights).sum().backward()
    want = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()

    model.set_attn_implementation(packing.register())
    lay, chosen = shared_prefix.layout(ids, attn, share)
    assert shared_prefix.saved_tokens(chosen) == 2 * 6 + 2 * 4
    assert lay.tokens == int(attn.sum()) - 20
    pred = packing.predictions(ids, lay)
    with torch.set_grad_enabled(path == "sdpa"):
        out = model(input_ids=packing.pack(ids, lay),
                    position_ids=packing.position_ids(model, ids, attn, lay)).logits[0]
    pairs = torch.log_softmax(out[pred.states], -1).gather(-1, pred.labels[:, None])[:, 0]
    shared = packing.scatter(pairs, pred)
    torch.testing.assert_close(shared, padded.detach(), atol=1e-5, rtol=1e-5)
    if path == "flex":
        return
    (shared * weights).sum().backward()
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad, want[n], atol=1e-5, rtol=1e-4, msg=n)


@pytest.fixture
def dynamo_on():
    """A test before this one may have started an in-process CPU engine, which turns dynamo off
    for the process (workers/vllm_engine.py); flex_attention needs it even uncompiled."""
    with torch._dynamo.config.patch(disable=False):
        yield


@pytest.mark.parametrize("kv_heads", [4, 2])
def test_the_flex_path_gives_the_sdpa_paths_attention(kv_heads, monkeypatch, dynamo_on):
    """packing.attention_path picks flex_attention under a block mask on CUDA and per-block
    SDPA elsewhere; both run here (flex eagerly) on rows, a trunk and its branches (grouped-query
    attention too): the same outputs."""
    torch.manual_seed(0)
    pos = torch.tensor([[0, 1, 2, 3, 4, 3, 4, 3, 4, 5, 0, 1, 2]])
    T, D = pos.shape[1], 8
    q = torch.randn(1, 4, T, D)
    k, v = torch.randn(1, kv_heads, T, D), torch.randn(1, kv_heads, T, D)
    attn = _Attn()
    attn.num_key_value_groups = 4 // kv_heads
    assert packing.attention_path(torch.device("cpu")) == "sdpa"
    assert packing.attention_path(torch.device("cuda")) == "flex"
    with torch._dynamo.config.patch(disable=True):     # dynamo off in this process: no flex
        assert packing.attention_path(torch.device("cuda")) == "sdpa"
    outs = {}
    for path in ("sdpa", "flex"):
        monkeypatch.setattr(packing, "FORCE_PATH", path)
        outs[path] = packing.varlen_sdpa(attn, q, k, v, None, scaling=1 / math.sqrt(D),
                                         position_ids=pos)[0]
    torch.testing.assert_close(outs["flex"], outs["sdpa"], atol=1e-5, rtol=1e-5)
    # the mask: a branch (tokens 5-6 at position 3) sees the trunk's first 3 tokens and itself
    mod = packing.block_mask_mod(pos[0])
    seen = [[bool(mod(0, 0, torch.tensor(a), torch.tensor(b))) for b in range(T)] for a in (5, 6)]
    assert [b for b in range(T) if seen[0][b]] == [0, 1, 2, 5]
    assert [b for b in range(T) if seen[1][b]] == [0, 1, 2, 5, 6]


# five rows, prompts (share = 4) then a reply: rows 0 and 1 are ESCRAG-R1-like (one dialogue
# 5 6 7, then each its own token), rows 2 and 3 have one prompt, row 4 is alone
UNIT_IDS = torch.tensor([[5, 6, 7, 8, 1, 2], [5, 6, 7, 9, 3, 0], [5, 6, 7, 8, 4, 0],
                         [5, 6, 7, 8, 9, 0], [1, 2, 3, 4, 5, 0]])
UNIT_LENGTHS = torch.tensor([6, 5, 5, 5, 5])
UNIT_SHARE = torch.tensor([4, 4, 4, 4, 4])


def test_units_are_a_groups_rows_or_without_group_ids_rows_with_one_prompt():
    assert shared_prefix.units(UNIT_IDS, UNIT_SHARE).tolist() == [0, 1, 0, 0, 2]
    groups = [7, 7, 3, 3, 9]                       # verl's uids, in any numbering
    assert shared_prefix.units(UNIT_IDS, UNIT_SHARE, groups=groups).tolist() == [0, 0, 1, 1, 2]
    # images split a group: equal placeholder tokens are not equal pictures
    classes = ["a", "b", "a", "a", "a"]
    assert shared_prefix.units(UNIT_IDS, UNIT_SHARE, classes, groups).tolist() == [0, 1, 2, 2, 3]


def test_a_units_prefix_is_what_all_its_rows_share():
    unit = torch.tensor([0, 0, 1, 1, 2])
    # unit 0: 5 6 7 8 / 5 6 7 9 share 3; unit 1 shares its whole 4-token prompt; 2 is alone
    got = shared_prefix.unit_prefixes(UNIT_IDS, UNIT_SHARE, UNIT_LENGTHS, unit)
    assert got.tolist() == [3, 3, 4, 4, 0]
    # a row keeps a token of its own: a 4-token row shares at most 3
    short = UNIT_LENGTHS.clone()
    short[3] = 4
    assert shared_prefix.unit_prefixes(UNIT_IDS, UNIT_SHARE, short, unit).tolist() == \
        [3, 3, 3, 3, 0]
