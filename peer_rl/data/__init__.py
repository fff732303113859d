"""The PEER data layer: layout, strict JSONL reading, per-row validation, loading, import, sample."""
