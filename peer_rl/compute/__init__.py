"""The policy's tensor arithmetic, pure functions the policy worker calls: packing rows into one
sequence, token-budget micro-batches, log-probs from logits, each pool's compute dtype."""
