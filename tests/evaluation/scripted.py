"""A party whose answers the test writes: the protocols and the runner are what is tested."""
from peer_rl.evaluation.endpoints import Endpoint, EndpointConfig, Reply


class Scripted(Endpoint):
    def __init__(self, answer, role="party"):
        self.answer, self.name, self.cfg = answer, role, EndpointConfig()
        self.batches = []           # the requests of each chat() call

    def chat(self, requests):
        self.batches.append(list(requests))
        out = []
        for r in requests:
            a = self.answer(r)
            out.append(a if isinstance(a, Reply) else Reply(texts=[a] * r.n))
        return out


def last_user(request) -> str:
    c = request.messages[-1]["content"]
    return c if isinstance(c, str) else " ".join(p.get("text", "") for p in c)
