"""Routing simulation: replay a Mooncake trace over N nodes, each with its own LRU cache, under a router.

Each node caches `capacity_pct`% of the trace's distinct blocks and serves prefills one at a time
at `prefill_tokens_per_s` (uncached tokens only: cached ones are loaded, taken as free here). A
request goes where the router says; the router sees every node's backlog (seconds of queued
prefill) as its load and, when cache-aware, how many leading blocks each node holds, exactly as
`kvstore.cluster.routing` routers see the Redis index in a daemon. Figures per (nodes, routing):

* token hit rate: prompt tokens inside the leading run of blocks cached on the chosen node;
* imbalance: the busiest node's prefill tokens / the mean node's (1.0 = perfectly even);
* mean TTFT proxy: queueing + prefill of the uncached tokens, seconds.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from kvstore.cluster.index import NodeInfo
from kvstore.cluster.routing import ROUTERS, make_router
from kvstore.sim.replay import capacity_blocks_for
from kvstore.sim.trace import Trace

logger = logging.getLogger(__name__)

ROUTINGS = list(ROUTERS)


@dataclass(frozen=True, slots=True, kw_only=True)
class RoutingResult:
    """One (trace, nodes, routing, capacity) simulation."""

    trace: str
    routing: str
    num_nodes: int
    capacity_pct: float
    capacity_blocks_per_node: int
    token_hit_rate: float
    block_hit_rate: float
    imbalance: float
    mean_ttft_s: float
    num_requests: int

    def to_record(self) -> dict[str, object]:
        return asdict(self)


class _Node:
    """One simulated node: an LRU cache of block keys and a FIFO prefill server."""

    def __init__(self, node_id: str, capacity: int) -> None:
        self.node_id, self.capacity = node_id, capacity
        self.cache: collections.OrderedDict[bytes, None] = collections.OrderedDict()
        self.busy_until = 0.0
        self.prefill_tokens = 0

    def leading(self, keys: Sequence[bytes]) -> int:
        run = 0
        for key in keys:
            if key not in self.cache:
                break
            run += 1
        return run

    def touch(self, keys: Sequence[bytes]) -> None:
        for key in reversed(keys):  # tail first, head last: a chain loses its tail first, as in the store
            self.cache[key] = None
            self.cache.move_to_end(key)
        while len(self.cache) > self.capacity:
            self.cache.popitem(last=False)


def simulate(trace: Trace, *, num_nodes: int, routing: str, capacity_pct: float,
             prefill_tokens_per_s: float = 20_000.0, max_load_gap_s: float | None = None) -> RoutingResult:
    """Replay `trace` over `num_nodes` nodes routed by `routing` (see ROUTINGS); load = backlog seconds."""
    capacity = capacity_blocks_for(trace, capacity_pct)
    nodes = {f"node-{i}": _Node(f"node-{i}", capacity) for i in range(num_nodes)}
    router = make_router(routing, lambda keys, ids: {i: nodes[i].leading(keys) for i in ids}, max_load_gap=max_load_gap_s)
    hit_tokens = hit_blocks = tokens = blocks = 0
    ttft_total = 0.0
    for request in trace.requests:
        now = request.timestamp / 1000.0  # Mooncake timestamps are milliseconds
        keys = [block.to_bytes(8, "little") for block in request.block_ids]
        views = [NodeInfo(n.node_id, max(0.0, n.busy_until - now)) for n in nodes.values()]
        node = nodes[router.choose(keys, views).node_id]
        run = node.leading(keys)
        cached = min(request.input_tokens, run * trace.block_tokens)
        start = max(now, node.busy_until)
        node.busy_until = start + (request.input_tokens - cached) / prefill_tokens_per_s
        node.prefill_tokens += request.input_tokens - cached
        node.touch(keys)
        ttft_total += node.busy_until - now
        hit_tokens, tokens = hit_tokens + cached, tokens + request.input_tokens
        hit_blocks, blocks = hit_blocks + run, blocks + len(keys)
    work = [n.prefill_tokens for n in nodes.values()]
    mean_work = sum(work) / len(work)
    return RoutingResult(trace=trace.name, routing=routing, num_nodes=num_nodes, capacity_pct=capacity_pct,
                         capacity_blocks_per_node=capacity, token_hit_rate=hit_tokens / max(1, tokens),
                         block_hit_rate=hit_blocks / max(1, blocks),
                         imbalance=max(work) / mean_work if mean_work else 1.0,
                         mean_ttft_s=ttft_total / max(1, len(trace.requests)), num_requests=len(trace.requests))


def simulate_all(trace: Trace, node_counts: Sequence[int], routings: Sequence[str],
                 capacities: Sequence[float]) -> list[RoutingResult]:
    return [simulate(trace, num_nodes=n, routing=r, capacity_pct=c)
            for c in capacities for n in node_counts for r in routings]


def run_routing_replay(trace: Trace, node_counts: Sequence[int], routings: Sequence[str] | None,
                       capacities: Sequence[float] | None) -> list[RoutingResult]:
    """What `kvstore replay TRACE --nodes N --routing NAME` runs: simulate and print the table."""
    from rich.console import Console
    from rich.table import Table

    unknown = [r for r in routings or [] if r not in ROUTINGS]
    if unknown:  # a CLI answer, not a traceback
        raise SystemExit(f"unknown routing {', '.join(unknown)}; valid: {', '.join(ROUTINGS)}")
    results = simulate_all(trace, node_counts, list(routings or ROUTINGS), list(capacities or [5.0]))
    table = Table(title=f"{trace.name}: {len(trace.requests):,} requests routed over {', '.join(map(str, node_counts))} nodes")
    for column in ("nodes", "capacity/node", "routing", "token hit", "block hit", "imbalance", "mean TTFT proxy"):
        table.add_column(column, justify="left" if column == "routing" else "right")
    for r in results:
        table.add_row(str(r.num_nodes), f"{r.capacity_pct:g}% ({r.capacity_blocks_per_node:,})", r.routing,
                      f"{r.token_hit_rate:.1%}", f"{r.block_hit_rate:.1%}", f"{r.imbalance:.2f}", f"{r.mean_ttft_s:.2f} s")
    Console(width=max(120, Console().width)).print(table)
    return results
