"""Hit rates by model and tier for /metrics: each tenant counts its own lookups and gets per model.

    kvstore_model_lookups_total{model}              lookup requests
    kvstore_model_lookup_chunks_total{model}        chunks they asked about
    kvstore_model_lookup_hit_chunks_total{model}    ... found (the leading held ones); _hit_tokens_total alike
    kvstore_model_get_chunks_total{model}           chunks asked for by gets
    kvstore_model_get_hit_chunks_total{model,tier}  ... served, by the tier that served each; _hit_bytes_total alike
    kvstore_model_lookup_hit_ratio{model}           hit chunks / asked chunks since start (rate() the counters
    kvstore_model_get_hit_ratio{model,tier}         for a window)

The model is what the client names in the MODEL_HEADER (kvstore/wire_types.py): chunk keys are hashes,
so the daemon cannot tell a model from its keys. Each tenant's counters live on its own `Tenant`, so
no tenant's series can show another's models; a tenant keeps MAX_MODEL_LABELS model labels (the first
it names) and counts every later model under OTHER_MODEL, so a client naming models at will cannot
grow the exposition without bound.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from prometheus_client.core import Metric

from kvstore.types import TierKind
from service.exposition import counter, gauge

MAX_MODEL_LABELS = 16  # per tenant; later models count under OTHER_MODEL
OTHER_MODEL = "other"


@dataclass(slots=True)
class ModelFigures:
    """One model's counts (chunks; bytes by tier)."""

    lookups: int = 0
    lookup_chunks: int = 0
    lookup_hit_chunks: int = 0
    lookup_hit_tokens: int = 0  # each model's chunks have its own layout's tokens
    get_chunks: int = 0
    hit_chunks_by_tier: defaultdict[str, int] = field(default_factory=lambda: defaultdict(int))
    hit_bytes_by_tier: defaultdict[str, int] = field(default_factory=lambda: defaultdict(int))

    def add(self, other: ModelFigures) -> None:
        self.lookups += other.lookups
        self.lookup_chunks += other.lookup_chunks
        self.lookup_hit_chunks += other.lookup_hit_chunks
        self.lookup_hit_tokens += other.lookup_hit_tokens
        self.get_chunks += other.get_chunks
        for tier, n in other.hit_chunks_by_tier.items():
            self.hit_chunks_by_tier[tier] += n
        for tier, n in other.hit_bytes_by_tier.items():
            self.hit_bytes_by_tier[tier] += n

    def copy(self) -> ModelFigures:
        duplicate = ModelFigures()
        duplicate.add(self)
        return duplicate


class ModelCounters:
    """One tenant's figures by model label (at most `max_labels` labels, then OTHER_MODEL). Thread-safe:
    lookups count on the event loop, gets on the I/O threads."""

    def __init__(self, max_labels: int = MAX_MODEL_LABELS) -> None:
        self._max_labels = max_labels
        self._lock = threading.Lock()
        self._by_model: dict[str, ModelFigures] = {}

    def _figures(self, model: str) -> ModelFigures:
        """The figures `model` counts into (called under the lock)."""
        figures = self._by_model.get(model)
        if figures is None:
            named = sum(1 for m in self._by_model if m != OTHER_MODEL)
            model = model if named < self._max_labels else OTHER_MODEL
            figures = self._by_model.setdefault(model, ModelFigures())
        return figures

    def count_lookup(self, model: str, asked_chunks: int, hit_chunks: int, hit_tokens: int) -> None:
        with self._lock:
            figures = self._figures(model)
            figures.lookups += 1
            figures.lookup_chunks += asked_chunks
            figures.lookup_hit_chunks += hit_chunks
            figures.lookup_hit_tokens += hit_tokens

    def count_get(self, model: str, served: Sequence[TierKind | None], chunk_bytes: int) -> None:
        """A get of `len(served)` chunks; `served[i]` the tier that served chunk i (None: a miss)."""
        with self._lock:
            figures = self._figures(model)
            figures.get_chunks += len(served)
            for tier in served:
                if tier is not None:
                    figures.hit_chunks_by_tier[tier.value] += 1
                    figures.hit_bytes_by_tier[tier.value] += chunk_bytes

    def snapshot(self) -> dict[str, ModelFigures]:
        with self._lock:
            return {model: figures.copy() for model, figures in self._by_model.items()}


Series = Mapping[tuple[str, ...], ModelFigures]  # label values (e.g. (tenant, model)) -> figures


def merged(snapshots: Iterable[Mapping[str, ModelFigures]]) -> dict[tuple[str, ...], ModelFigures]:
    """Several tenants' figures summed by model (for a caller who may not see tenant names)."""
    total: dict[tuple[str, ...], ModelFigures] = {}
    for snapshot in snapshots:
        for model, figures in snapshot.items():
            total.setdefault((model,), ModelFigures()).add(figures)
    return total


def model_families(series: Series, label_names: tuple[str, ...]) -> Iterable[Metric]:
    """The kvstore_model_* families of `series`, labelled `label_names` (the last one is "model")."""
    rows = sorted(series.items())
    counters = {"lookups": ("Lookup requests, by model.", lambda f: f.lookups),
                "lookup_chunks": ("Chunks lookups asked about, by model.", lambda f: f.lookup_chunks),
                "lookup_hit_chunks": ("Chunks lookups found held, by model.", lambda f: f.lookup_hit_chunks),
                "lookup_hit_tokens": ("Tokens lookups found held, by model.",
                                      lambda f: f.lookup_hit_tokens),
                "get_chunks": ("Chunks gets asked for, by model.", lambda f: f.get_chunks)}
    for name, (help_text, value_of) in counters.items():
        yield counter(f"kvstore_model_{name}", help_text, ((values, value_of(f)) for values, f in rows), label_names)
    by_tier = (*label_names, "tier")
    for name, help_text, attribute in (("chunks", "Chunks gets were served, by model and serving tier.",
                                        "hit_chunks_by_tier"),
                                       ("bytes", "Bytes gets were served, by model and serving tier.",
                                        "hit_bytes_by_tier")):
        yield counter(f"kvstore_model_get_hit_{name}", help_text,
                      (((*values, tier), n) for values, f in rows for tier, n in sorted(getattr(f, attribute).items())),
                      by_tier)
    yield gauge("kvstore_model_lookup_hit_ratio", "Lookup hit chunks / asked chunks since start, by model.",
                ((values, _ratio(f.lookup_hit_chunks, f.lookup_chunks)) for values, f in rows), label_names)
    yield gauge("kvstore_model_get_hit_ratio", "Chunks a tier served / chunks gets asked for since start, by model "
                "and tier.", (((*values, tier), _ratio(n, f.get_chunks)) for values, f in rows
                              for tier, n in sorted(f.hit_chunks_by_tier.items())), by_tier)


def _ratio(part: int, whole: int) -> float:
    return round(part / whole, 6) if whole else 0.0
