"""The methods: each a step's stages 2-5 (rollout, parse, reward, RUR), registered by name.
Importing the package registers PEER, ESCRAG-R1 and training on whole conversations."""
from peer_rl.methods.base import Groups, Method, Settings, method_class, register, registered
from peer_rl.methods import dialogue, escrag_r1, peer  # noqa: F401  (registers them)

__all__ = ["Groups", "Method", "Settings", "method_class", "register", "registered"]
