"""Padding-free forwards (verl's `use_remove_padding`): a micro-batch's rows laid end to end.

Why: rows of a micro-batch differ in length, and a right-padded (B, L) forward spends every
linear layer, the output head and the attention on the padded positions as well (13-16% of the
positions at the tiny recipe's shape). Packed, the micro-batch is one row of its real tokens
only; each row keeps its own positions (0, 1, ... within the row) and attends to itself alone.

The attention that keeps rows apart is `varlen_sdpa`: the rows' segments are found where the
positions restart at 0 (transformers' own convention for packed rows, which its flash-attention
path follows too) and each segment runs PyTorch's causal SDPA on its own. The cost is the sum of
the rows' squared lengths (never the packed row's), and no (T, T) mask is ever built. Rows that
share a prefix (peer_rl.compute.shared_prefix) run it once: a row whose positions continue the
prefix's (a position that drops below the previous one + 1) is a branch, and attends to the
first `position` tokens of its segment and to itself.
Vision-language policies with multimodal RoPE (Qwen2-VL, Qwen2.5-VL) take 4-row position ids:
the text positions first (what finds the segments), then the model's three rotary rows.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

ATTENTION = "peer_rl_varlen_sdpa"   # the name registered with transformers' AttentionInterface


@dataclass(frozen=True)
class Layout:
    """Where a right-padded (B, L) batch's real tokens go in the packed row."""
    index: torch.Tensor       # (T,) flat (row * L + column) positions of the real tokens
    positions: torch.Tensor   # (T,) each token's column in its own row: 0 .. length - 1
    shape: tuple[int, int]    # (B, L)
    source: torch.Tensor      # (B * L,) packed position each real token's state comes from, -1
                              # at padding (a shared prefix token: the one its trunk ran)

    @property
    def tokens(self) -> int:
        return int(self.index.numel())


def layout(attention_mask: torch.Tensor) -> Layout:
    """The packing of a right-padded batch (`attention_mask` (B, L), ones then zeros per row).
    Rows with holes or left padding are refused: their columns would not be their positions."""
    if attention_mask.dim() != 2:
        raise ValueError(f"attention_mask: expected (rows, columns), got shape "
                         f"{tuple(attention_mask.shape)}")
    mask = attention_mask.bool()
    lengths = mask.sum(1)
    cols = torch.arange(mask.shape[1], device=mask.device)
    if not torch.equal(mask, cols[None, :] < lengths[:, None]):
        bad = int((mask != (cols[None, :] < lengths[:, None])).any(1).nonzero()[0])
        raise ValueError(f"attention_mask row {bad}: expected right padding (ones, then zeros)")
    index = mask.reshape(-1).nonzero().squeeze(1)
    return Layout(index=index, positions=index % mask.shape[1], shape=tuple(mask.shape),
                  source=flat_source(index, mask.numel()))


def flat_source(index: torch.Tensor, size: int) -> torch.Tensor:
    """(size,) packed position of each flat position `index` names, -1 elsewhere."""
    src = torch.full((size,), -1, dtype=torch.long)
    src[index.cpu()] = torch.arange(index.numel())
    return src


@dataclass(frozen=True)
class Predictions:
    """Which hidden state scores which token: every real token after a row's first is scored
    from the state of the token before it. Pairs (state, label) that rows share (a shared
    prefix) are scored once."""
    states: torch.Tensor      # (U,) packed positions
    labels: torch.Tensor      # (U,) token ids
    inverse: torch.Tensor     # (B, L) the pair that scores each token, -1 where none does


def predictions(ids: torch.Tensor, lay: Layout) -> Predictions:
    """The (state, label) pairs of a right-padded batch `ids` (B, L) packed as `lay`."""
    B, L = lay.shape
    src = lay.source.view(B, L)
    prev, cur = src[:, :-1], src[:, 1:]
    real = (cur >= 0) & (prev >= 0)
    labels = ids[:, 1:].cpu()
    vocab = int(labels.max()) + 1 if labels.numel() else 1
    key = prev * vocab + labels                # one key per (state, label) pair
    uniq, inv = torch.unique(key[real], return_inverse=True)
    inverse = torch.full((B, L), -1, dtype=torch.long)
    inverse[:, 1:][real] = inv
    return Predictions(states=uniq // vocab, labels=uniq % vocab, inverse=inverse)


def scatter(values: torch.Tensor, pred: Predictions) -> torch.Tensor:
    """(U, ...) values of the pairs -> (B, L, ...), 0 where no pair scores a token;
    differentiable."""
    inv = pred.inverse.to(values.device)
    out = values[inv.clamp_min(0)]
    return out.masked_fill((inv < 0).view(*inv.shape, *([1] * (values.dim() - 1))), 0.0)


def packed_images(lay: Layout, ids: torch.Tensor, image_token_id: int,
                  tokens_per_image: Sequence[int]) -> list[int]:
    """Which of a right-padded batch's images (row by row, each row's in order: the order of
    `image_grid_thw`) have their tokens in the packed row, in the order the packed row holds
    them: the images the model's vision tower must encode for it. An image inside a shared
    prefix is encoded once, with its trunk."""
    pos = (ids.cpu() == image_token_id).nonzero()           # (n, 2), row-major
    if int(sum(tokens_per_image)) != len(pos):
        raise ValueError(f"{len(pos)} image token(s) in the ids, {sum(tokens_per_image)} in the "
                         "images' grids")
    if not len(pos):
        return []
    starts = torch.tensor([0, *tokens_per_image[:-1]], dtype=torch.long).cumsum(0)
    first = pos[starts]
    at = torch.full((lay.shape[0] * lay.shape[1],), -1, dtype=torch.long)
    at[lay.index.cpu()] = torch.arange(lay.tokens)
    where = at[first[:, 0] * lay.shape[1] + first[:, 1]]
    kept = (where >= 0).nonzero().squeeze(1)
    return kept[torch.argsort(where[kept])].tolist()


def pack(x: torch.Tensor, lay: Layout) -> torch.Tensor:
    """(B, L, ...) -> (1, T, ...): the real tokens only, row after row."""
    return x.reshape(lay.shape[0] * lay.shape[1], *x.shape[2:])[lay.index.to(x.device)][None]


def unpack(y: torch.Tensor, lay: Layout) -> torch.Tensor:
    """(1, T, ...) -> (B, L, ...), zeros at the padding; differentiable."""
    flat = y.new_zeros((lay.shape[0] * lay.shape[1], *y.shape[2:]))
    flat = flat.index_copy(0, lay.index.to(y.device), y[0])
    return flat.view(*lay.shape, *y.shape[2:])


def segments(position_ids: torch.Tensor) -> list[tuple[int, int]]:
    """[start, end) of each packed row of a (1, T) position row: a row starts where its
    position is 0."""
    starts = (position_ids.reshape(-1) == 0).nonzero().squeeze(1).tolist()
    if not starts or starts[0] != 0:
        raise ValueError("packed position ids must start at 0")
    return list(zip(starts, starts[1:] + [position_ids.numel()]))


def blocks(position_ids: torch.Tensor) -> list[tuple[int, int, int, int]]:
    """(start, end, trunk, seen) of each run of consecutive positions in a (1, T) position
    row: queries [start, end) attend causally to themselves and to the `seen` tokens from
    `trunk` on (a branch of a shared prefix: seen = its first position; a row or a trunk:
    seen = 0)."""
    pos = position_ids.reshape(-1)
    if not pos.numel() or int(pos[0]) != 0:
        raise ValueError("packed position ids must start at 0")
    starts = ((pos[1:] != pos[:-1] + 1).nonzero().squeeze(1) + 1).tolist()
    firsts = pos[[0] + starts].tolist()
    out, trunk, trunk_len = [], 0, 0
    for start, end, seen in zip([0] + starts, starts + [pos.numel()], firsts):
        if seen == 0:
            trunk, trunk_len = start, end - start
        elif seen > trunk_len:
            raise ValueError(f"packed position ids: the branch at token {start} continues "
                             f"position {seen}, past its trunk's {trunk_len} tokens")
        out.append((start, end, trunk, seen))
    return out


def varlen_sdpa(module, query, key, value, attention_mask, dropout: float = 0.0,
                scaling: float | None = None, position_ids=None, **kwargs):
    """transformers attention function: causal attention within each packed row (and each
    branch's shared prefix), by the path `attention_path` picks for the device. Anything that
    is not a packed causal forward (a batch of rows, a mask, an encoder's bidirectional
    attention, a decoding step) goes to transformers' SDPA unchanged."""
    # deferred: transformers
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    plain = (query.shape[0] != 1 or attention_mask is not None or position_ids is None
             or not getattr(module, "is_causal", True) or query.shape[2] != key.shape[2])
    if plain:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, **kwargs)
    pos = position_ids[0] if position_ids.dim() == 3 else position_ids
    if attention_path(query.device) == "flex":
        return flex_blocks(query, key, value, position_ids, scaling), None
    return sdpa_blocks(module, query, key, value, pos[:1], dropout, scaling), None


FORCE_PATH: str | None = None     # "sdpa" or "flex" on every device (the tests of each path)


def attention_path(device: torch.device) -> str:
    """Which attention serves packed rows: "flex" (one `flex_attention` call under a block mask
    of the rows and branches, compiled) on CUDA, "sdpa" (PyTorch SDPA per row and per branch)
    elsewhere: the CPU's SDPA kernels are fast on small blocks and flex_attention's CPU route
    compiles with inductor at start-up. A process that turned torch.compile off (a CPU
    engine beside the policy, peer_rl.workers.vllm_engine) keeps "sdpa": flex_attention needs
    dynamo even uncompiled."""
    if FORCE_PATH is not None:
        return FORCE_PATH
    if torch.device(device).type == "cuda" and not torch._dynamo.config.disable:
        return "flex"
    return "sdpa"


def sdpa_blocks(module, query, key, value, pos, dropout: float = 0.0,
                scaling: float | None = None) -> torch.Tensor:
    """The "sdpa" path: each block of `blocks(pos)` as its own SDPA call, (1, T, H, D)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    outs = []
    for s, e, trunk, seen in blocks(pos[:1]):
        if not seen:
            outs.append(sdpa_attention_forward(
                module, query[:, :, s:e], key[:, :, s:e], value[:, :, s:e], None,
                dropout=dropout, scaling=scaling, is_causal=True)[0])
            continue
        # a branch: the shared prefix whole, then itself causally (lower-right aligned)
        k = torch.cat([key[:, :, trunk:trunk + seen], key[:, :, s:e]], dim=2)
        v = torch.cat([value[:, :, trunk:trunk + seen], value[:, :, s:e]], dim=2)
        n = e - s
        mask = torch.ones(n, seen + n, dtype=torch.bool, device=query.device).tril(seen)
        outs.append(sdpa_attention_forward(module, query[:, :, s:e], k, v, mask[None, None],
                                           dropout=dropout, scaling=scaling)[0])
    return torch.cat(outs, dim=1)


def block_mask_mod(pos: torch.Tensor):
    """flex_attention's mask_mod of a packed row: query q sees key k when both are in one
    block of `blocks(pos)` and k <= q, or k is in the shared prefix q's block continues."""
    spans = blocks(pos)
    T = pos.numel()
    device = pos.device
    block = torch.zeros(T, dtype=torch.long, device=device)
    trunk = torch.tensor([t for _, _, t, _ in spans], dtype=torch.long, device=device)
    seen = torch.tensor([n for _, _, _, n in spans], dtype=torch.long, device=device)
    for i, (s, e, _, _) in enumerate(spans):
        block[s:e] = i

    def mask_mod(b, h, q, k):
        bq = block[q]
        own = (block[k] == bq) & (k <= q)
        prefix = (k >= trunk[bq]) & (k < trunk[bq] + seen[bq])
        return own | prefix
    return mask_mod


_FLEX: dict = {}


def flex_blocks(query, key, value, position_ids, scaling: float | None = None) -> torch.Tensor:
    """The "flex" path: one flex_attention call under the packed row's block mask, (1, T, H, D).
    The mask is built once per forward: every layer of a forward is handed the same
    `position_ids` object, held here so that no later tensor can take its place. Compiled on
    CUDA; eager elsewhere (tests), which materialises the scores."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    T = query.shape[2]
    if _FLEX.get("positions") is not position_ids:
        pos = (position_ids[0] if position_ids.dim() == 3 else position_ids)[:1].reshape(-1)
        _FLEX.update(positions=position_ids, mask=create_block_mask(
            block_mask_mod(pos), None, None, T, T, device=query.device))
    fn = flex_attention
    if query.device.type == "cuda":
        fn = _FLEX.setdefault("compiled", torch.compile(flex_attention, dynamic=True))
    out = fn(query, key, value, block_mask=_FLEX["mask"], scale=scaling,
             enable_gqa=query.shape[1] != key.shape[1])
    return out.transpose(1, 2).contiguous()


def register() -> str:
    """Make `ATTENTION` a transformers attention implementation (no mask is built for it)."""
    from transformers import AttentionInterface  # deferred: transformers (~3 s, pulls in torch)

    AttentionInterface.register(ATTENTION, varlen_sdpa)
    return ATTENTION


def position_ids(model, ids: torch.Tensor, attention_mask: torch.Tensor, lay: Layout,
                 vision: dict | None = None) -> torch.Tensor:
    """The packed row's position ids: (1, T) for 1-D RoPE models; (4, 1, T) for models with
    multimodal RoPE (`get_rope_index`): text positions, then the temporal/height/width rows the
    model computes on the padded batch (image tokens' positions follow the image grid)."""
    text = lay.positions[None].to(ids.device)
    inner = getattr(model, "model", None)
    if not hasattr(inner, "get_rope_index"):
        return text
    vision = vision or {}
    if vision.get("image_grid_thw") is None:
        rope = text[None].expand(3, 1, -1)
    else:
        full, _ = inner.get_rope_index(ids, mm_token_type_ids=vision["mm_token_type_ids"],
                                       image_grid_thw=vision["image_grid_thw"],
                                       attention_mask=attention_mask)
        rope = torch.stack([pack(r, lay) for r in full.to(ids.device)])   # (3, 1, T)
    return torch.cat([text[None], rope], dim=0)
