"""Chunked log-probs and entropy against the full-logits formulas, values and gradients."""
import pytest
import torch

from peer_rl.compute.token_logprobs import chunked_logprobs


def reference(hidden, weight, labels, temperature):
    """The plain route, written out: full logits, log-softmax, -sum p log p."""
    logits = (hidden @ weight.T) / temperature
    logp = torch.log_softmax(logits, -1)
    return logp.gather(-1, labels[..., None])[..., 0], -(logp.exp() * logp).sum(-1)


def _inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(2, 7, 16, generator=g, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(50, 16, generator=g, dtype=torch.float64, requires_grad=True)
    labels = torch.randint(0, 50, (2, 7), generator=g)
    return hidden, weight, labels


@pytest.mark.parametrize("chunk", [1, 3, 14, 100])
def test_values_and_gradients_equal_the_full_logits(chunk):
    hidden, weight, labels = _inputs()
    lp, ent = chunked_logprobs(hidden, weight, None, labels, 0.7, chunk, entropy="grad")
    want_lp, want_ent = reference(hidden, weight, labels, 0.7)
    torch.testing.assert_close(lp, want_lp, rtol=0, atol=1e-12)
    torch.testing.assert_close(ent, want_ent, rtol=0, atol=1e-12)
    coef = torch.linspace(-1, 1, 14, dtype=torch.float64).view(2, 7)
    got = torch.autograd.grad((lp * coef).sum() + 0.1 * ent.sum(), (hidden, weight))
    want = torch.autograd.grad((want_lp * coef).sum() + 0.1 * want_ent.sum(), (hidden, weight))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def test_metric_entropy_carries_no_gradient():
    hidden, weight, labels = _inputs(1)
    lp, ent = chunked_logprobs(hidden, weight, None, labels, 1.0, 4, entropy="metric")
    assert lp.requires_grad and not ent.requires_grad
    torch.testing.assert_close(ent, reference(hidden, weight, labels, 1.0)[1], rtol=0, atol=1e-12)
    _, none = chunked_logprobs(hidden, weight, None, labels, 1.0, 4, entropy="none")
    assert torch.count_nonzero(none) == 0


def test_backward_keeps_no_full_logits():
    """What autograd saves for backward beyond the inputs: the plain route keeps
    (tokens x vocab) tensors, the chunked one next to nothing (each chunk keeps views of its
    inputs and recomputes its logits in backward)."""
    def saved_bytes(fn):
        seen: dict = {}          # distinct tensors, not counting the inputs themselves

        def pack(t):
            if t.untyped_storage().data_ptr() in inputs:
                return t
            seen[(t.untyped_storage().data_ptr(), t.storage_offset(), t.shape)] = \
                t.numel() * t.element_size()
            return t
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            fn()
        return sum(seen.values())

    g = torch.Generator().manual_seed(2)
    hidden = torch.randn(64, 32, generator=g, requires_grad=True)
    weight = torch.randn(4000, 32, generator=g, requires_grad=True)
    labels = torch.randint(0, 4000, (64,), generator=g)
    inputs = {x.untyped_storage().data_ptr() for x in (hidden, weight, labels)}
    logits_bytes = 64 * 4000 * 4
    plain = saved_bytes(lambda: reference(hidden, weight, labels, 1.0))
    chunked = saved_bytes(lambda: chunked_logprobs(hidden, weight, None, labels, 1.0, 16, "grad"))
    assert plain >= logits_bytes
    assert chunked < logits_bytes / 4, (chunked, logits_bytes)
