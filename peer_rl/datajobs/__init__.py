"""Data jobs: building the papers' data from raw corpora with a language model.

PEER filtered its sources with a large model (semantic incoherence, artificial stylistic
patterns, non-dialogue content), augmented SER by DISC personality rewriting (traits extracted
per seeker, K-Means clusters, a dialogue rewritten with a persona of its cluster, the rewrite
filtered again) and kept the informative middle rounds of each dialogue (Gaussian round
sampling). ESCRAG-R1 built ESC-Preference from simulated Client / Counselor / Judge dialogues
with dominance-based selection. Each job here is one of those steps:

    filter      rows -> verdict + reason per dialogue -> a root without the removed rows
    personas    SER seekers -> DISC description per seeker -> embeddings -> K-Means clusters
    rewrite     SER train rows -> persona from the seeker's cluster -> rewritten copies
                (`source: augmented`), each passed through the filter
    rounds      raw dialogues (ESConv-style, PEER grpo) -> Gaussian-sampled rounds
    preference  seed situations -> simulated dialogues -> chosen / rejected pairs + exemplars

The language-model jobs use the evaluation's parties (peer_rl.evaluation.endpoints: an
OpenAI-compatible API or a local checkpoint on vLLM), its lock-step runner (each party answers
a batch at a time) and its run store (one fsynced line per finished case), so a killed job
rerun with the same command finishes with every row exactly once. Outputs are written only
from the finished store, each file renamed into place.
"""
