"""Drive many evaluation cases in lock-step so that each party answers in batches.

A protocol writes one case as a generator: it yields `(role, Request)` whenever it needs a party
to speak and receives that request's texts (or `(role, [Request, ...])` and receives a list of
them), and finally returns the case's record. The runner keeps
`batch_cases` generators in flight, gathers what they ask per role into one `Endpoint.chat`
call, and appends each finished record to the run store. A request the endpoint refused ends
its case with an `error` record (counted in the report); an `EndpointError` stops the run with
every finished case already on disk.
"""
from __future__ import annotations

from collections.abc import Callable, Generator, Iterable


from peer_rl.evaluation.endpoints import Endpoint, Request
from peer_rl.evaluation.store import RunStore
from peer_rl.log import progress_bar

CaseProgram = Generator[tuple[str, Request | list[Request]], list, dict]


def run_cases(cases: Iterable, program: Callable[[object], CaseProgram],
              endpoints: dict[str, Endpoint], store: RunStore, batch_cases: int = 8,
              desc: str = "eval") -> int:
    """Run every case not yet in `store`; returns how many ran now. Cases need an `id`."""
    cases = list(cases)
    todo = [c for c in cases if not store.done(c.id)]
    bar = progress_bar(total=len(cases), initial=len(cases) - len(todo), desc=desc, unit="case")
    for start in range(0, len(todo), batch_cases):
        for record in _run_chunk(todo[start:start + batch_cases], program, endpoints):
            store.append(record)
            bar.update(1)
    bar.close()
    return len(todo)


def _run_chunk(chunk: list, program, endpoints: dict[str, Endpoint]) -> list[dict]:
    done: list[dict] = []
    waiting: dict[str, tuple] = {}      # case id -> (case, generator, role, requests, many)

    def advance(case, gen, texts):
        try:
            role, req = gen.send(texts)
        except StopIteration as stop:
            done.append({"id": case.id, **stop.value})
            return
        if role not in endpoints:
            raise KeyError(f"protocol asked for role {role!r}; endpoints: {sorted(endpoints)}")
        many = isinstance(req, list)
        waiting[case.id] = (case, gen, role, req if many else [req], many)

    for case in chunk:
        advance(case, program(case), None)
    while waiting:
        by_role: dict[str, list] = {}
        for case, gen, role, reqs, many in waiting.values():
            by_role.setdefault(role, []).append((case, gen, reqs, many))
        waiting = {}
        for role, items in by_role.items():
            replies = iter(endpoints[role].chat([r for _, _, reqs, _ in items for r in reqs]))
            for case, gen, reqs, many in items:
                mine = [next(replies) for _ in reqs]
                errors = [r.error for r in mine if r.error is not None]
                if errors:
                    gen.close()
                    done.append({"id": case.id, "error": f"{role}: {errors[0]}"})
                else:
                    advance(case, gen, [r.texts for r in mine] if many else mine[0].texts)
    order = {c.id: i for i, c in enumerate(chunk)}
    return sorted(done, key=lambda r: order[r["id"]])


def run_all(cases: Iterable, program: Callable[[object], CaseProgram],
            endpoints: dict[str, Endpoint], batch_cases: int = 8) -> list[dict]:
    """Every case, in memory (no store): the in-training evaluation."""
    cases = list(cases)
    return [rec for start in range(0, len(cases), batch_cases)
            for rec in _run_chunk(cases[start:start + batch_cases], program, endpoints)]
