"""Real pretrained models from pinned wheels (`peer-rl models`)."""
