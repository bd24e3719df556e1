"""The two lanes in which a text model instance runs its requests (copied next to model.py, as model_common.py).

Why lanes: Triton queues requests first in, first out, and an instance busy with a batch takes nothing new until
the batch is done, so a one-word request sent while other clients keep the server full of maximum-cost requests
waited behind all of them (8.2 s with 16 in flight on the smoke model). Here `execute` only parses and prices a
request and hands it to a lane, then returns (the response comes from the lane, through the request's response
sender), so Triton's queue never holds anything back:
- the express lane runs cheap requests (cost ≤ `express_cost`, a few sentences' worth) in batches of at most
  `EXPRESS_BATCHES` × `express_cost`, cheapest first, of requests of similar cost (within `SIMILAR_COST` × of
  the batch's first; while requests have waited over `AGING_S`, every other batch takes them first, so none
  starves and a cheap one still waits for at most two batches): 16 requests just
  under `express_cost` used to form one batch that a one-word request sent after them waited for (0.52 s median,
  issue 61); now it waits for the batch in progress only, and runs with requests as short as itself;
- the bulk lane runs the others the same way, in batches of at most `max_execute_cost`.
The two run at once in the instance (the runtime's searches may run in several threads; onnxruntime releases the
GIL), so a cheap request never waits for a heavy one: at worst for the cheap ones ahead of it. Why cost and not
priorities: a priority must be asked for by the client, while the cost is known here before anything runs. Each lane
holds at most `max_queued_cost` of work; a request beyond it is answered UNAVAILABLE at once (retry), so memory stays
bounded. Within that, each client (the gate names it: an address and its `zoo-client` key, serve/gate_http.py) may
hold at most 1 / CLIENT_SHARE of a lane's room, and the bulk lane takes the clients' tickets in turn (each one's
first waiting ticket, then each one's second, …, starting after the client served last): one client keeping 40
maximum-cost requests in flight filled both bulk lanes before, and every other bulk request was refused or waited
behind all of them.
"""

from __future__ import annotations

import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

EXPRESS_BATCHES = 1  # the express lane's batch budget, in express_cost units: what a cheap request may wait for
SIMILAR_COST = 4  # cheapest-first batches take only tickets within this factor of the batch's first, either way:
#                   a batch runs until its longest search ends, so a one-word request batched with a 99-token one
#                   waits for all of it (16 just-cheap requests kept a one-word request at 0.32 s median that way)
AGING_S = 1.0  # a ticket waiting this long is taken before any newer one, whatever its cost
CLIENT_SHARE = 2  # one client holds at most 1/CLIENT_SHARE of a lane's waiting room (one ticket always fits)


def _similar(a: int, b: int) -> bool:
    return max(a, b) <= SIMILAR_COST * max(min(a, b), 1)


class Ticket:
    """A priced request waiting in a lane: the parsed request (`_Request` of model_common), its response sender,
    when its `execute` began (its latency is measured from there) and the client the gate named ("": unnamed)."""

    def __init__(self, request: Any, sender: Any, started: float, client: str = "") -> None:
        self.request, self.sender, self.started, self.client = request, sender, started, client

    @property
    def cost(self) -> int:
        return int(self.request.cost)


class Lane:
    """One worker thread running batches of the tickets put to it: each batch takes the waiting tickets in
    arrival order up to `batch_cost` (always at least one), and `run(batch)` answers every ticket of it."""

    def __init__(
        self,
        name: str,
        batch_cost: int,
        queued_cost: int,
        run: Callable[[list[Ticket]], None],
        cheapest_first: bool = False,
    ) -> None:
        self.name, self.batch_cost, self.queued_cost, self.run = name, batch_cost, queued_cost, run
        self.cheapest_first = cheapest_first
        self.aged_turn = False  # whose turn it is while tickets are overdue: theirs (True) or the cheapest's
        self.waiting: list[Ticket] = []
        self.queued = 0  # cost of the waiting tickets
        self.by_client: dict[str, int] = {}  # … per client
        self.last_client: str | None = None  # whose ticket a batch took last (the bulk lane's turn goes on after)
        self.condition = threading.Condition()
        self.stopping = False
        self.thread = threading.Thread(target=self._work, name=f"zoo-{name}-lane", daemon=True)
        self.thread.start()

    def put(self, ticket: Ticket) -> str | None:
        """Queue `ticket` (None), or the reason it is not: the lane already holds `queued_cost` of work, or its
        client 1/CLIENT_SHARE of that."""
        with self.condition:
            if self.stopping:
                return f"this instance's {self.name} lane is stopping; retry"
            if self.waiting and self.queued + ticket.cost > self.queued_cost:
                return f"{self.queued} row-steps already wait in this instance's {self.name} lane; retry"
            mine = self.by_client.get(ticket.client, 0)
            if ticket.client and mine and mine + ticket.cost > self.queued_cost // CLIENT_SHARE:
                return (
                    f"{mine} row-steps of yours already wait in this instance's {self.name} lane, the share of one "
                    "client (the rest is kept for others); retry when some are answered"
                )
            self.waiting.append(ticket)
            self.queued += ticket.cost
            self.by_client[ticket.client] = mine + ticket.cost
            self.condition.notify()
        return None

    def _take(self) -> list[Ticket] | None:
        with self.condition:
            while not self.waiting and not self.stopping:
                self.condition.wait()
            if self.stopping:
                return None
            order = self._order() if self.cheapest_first else self._in_turn()
            batch, spent = [], 0
            for ticket in order:
                if batch and spent + ticket.cost > self.batch_cost:
                    break
                if batch and self.cheapest_first and not _similar(batch[0].cost, ticket.cost):
                    continue
                batch.append(ticket)
                spent += ticket.cost
            taken = {id(t) for t in batch}
            self.waiting = [t for t in self.waiting if id(t) not in taken]
            self.queued -= spent
            self.last_client = batch[-1].client
            for ticket in batch:
                left = self.by_client[ticket.client] - ticket.cost
                if left:
                    self.by_client[ticket.client] = left
                else:
                    del self.by_client[ticket.client]
            return batch

    def _in_turn(self) -> list[Ticket]:
        """The clients' tickets in turn: every client's first waiting ticket, then every client's second, …, the
        clients in order of arrival starting after the one whose ticket ran last; one client's backlog does not
        hold up another's request."""
        clients = list(dict.fromkeys(t.client for t in self.waiting))  # by their first waiting ticket
        start = clients.index(self.last_client) + 1 if self.last_client in clients else 0
        turn = {c: (i - start) % len(clients) for i, c in enumerate(clients)}
        seen: dict[str, int] = {}
        ranked = []
        for position, ticket in enumerate(self.waiting):
            rank = seen.get(ticket.client, 0)
            seen[ticket.client] = rank + 1
            ranked.append(((rank, turn[ticket.client], position), ticket))
        return [ticket for _, ticket in sorted(ranked, key=lambda r: r[0])]

    def _order(self) -> list[Ticket]:
        """Every other batch while any ticket is overdue (waiting over AGING_S): the overdue ones in arrival order,
        then the rest cheapest first; otherwise all cheapest first. Overdue first on every batch made a one-word
        request wait behind the whole backlog whenever a loaded machine let the backlog age past AGING_S (1.3 s
        median behind 16 just-cheap requests); alternating bounds both: the overdue ones progress every other
        batch, a cheap one waits for at most two."""
        now = time.perf_counter()
        overdue = [t for t in self.waiting if now - t.started > AGING_S]
        if not overdue:
            return sorted(self.waiting, key=lambda t: t.cost)
        self.aged_turn = not self.aged_turn
        if not self.aged_turn:
            return sorted(self.waiting, key=lambda t: t.cost)
        fresh = [t for t in self.waiting if now - t.started <= AGING_S]
        return overdue + sorted(fresh, key=lambda t: t.cost)

    def _work(self) -> None:
        while (batch := self._take()) is not None:
            try:
                self.run(batch)  # answers every ticket, whatever fails (model_common.TextModel._run)
            except Exception:  # a bug there must not end the lane (the requests after it still run): logged
                traceback.print_exc()

    def stop(self) -> list[Ticket]:
        """Stop after the batch in progress; returns the tickets still waiting (to be answered by the caller)."""
        with self.condition:
            self.stopping = True
            left, self.waiting, self.queued, self.by_client = self.waiting, [], 0, {}
            self.condition.notify_all()
        self.thread.join(timeout=60)
        return left
