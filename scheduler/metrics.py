"""Prometheus metrics of one scheduler: block usage, prefix hit rate, admission counters, queue wait.

``prometheus_client`` is imported when a scheduler is created with ``metrics=True`` (never at module import), and
each scheduler gets its own ``CollectorRegistry`` so several schedulers (replicas, tests) never collide. Expose
with ``prometheus_client.generate_latest(metrics.registry)`` or ``start_http_server(port, registry=...)``.
"""

from __future__ import annotations

from collections.abc import Sized
from typing import Any, Protocol

from .prefix_cache import PrefixCache


class SchedulerView(Protocol):
    """What ``observe_step`` reads of a ``scheduler.Scheduler``; typed here because that module imports this one."""

    @property
    def cache(self) -> PrefixCache: ...
    @property
    def used_blocks(self) -> int: ...
    @property
    def queue(self) -> Sized: ...
    @property
    def running(self) -> Sized: ...


class SchedulerMetrics:
    def __init__(self, prefix: str = "trtforge_scheduler") -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry()
        r = self.registry
        self.free_blocks = Gauge(f"{prefix}_free_blocks", "KV blocks on the free list", registry=r)
        self.used_blocks = Gauge(f"{prefix}_used_blocks", "KV blocks referenced by running requests", registry=r)
        self.cached_blocks = Gauge(f"{prefix}_cached_blocks", "KV blocks findable by prefix hash", registry=r)
        self.prefix_hit_rate = Gauge(f"{prefix}_prefix_hit_rate", "prefix blocks hit / prefix blocks queried",
                                     registry=r)
        self.queued = Gauge(f"{prefix}_queued_requests", "requests waiting for admission", registry=r)
        self.running = Gauge(f"{prefix}_running_requests", "admitted requests not yet finished", registry=r)
        self.admitted = Counter(f"{prefix}_admitted", "requests admitted (a preempted one counts again)",
                                registry=r)
        self.rejected = Counter(f"{prefix}_rejected", "requests rejected at submission", registry=r)
        self.preempted = Counter(f"{prefix}_preempted", "running requests preempted (recompute)", registry=r)
        self.queue_wait_steps = Histogram(f"{prefix}_queue_wait_steps", "scheduler steps between queueing and "
                                          "admission", buckets=(0, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 5000),
                                          registry=r)
        self.queue_wait_seconds = Histogram(f"{prefix}_queue_wait_seconds", "seconds between queueing and "
                                            "admission (the scheduler's clock)", buckets=(0.01, 0.1, 0.5, 1, 2, 5,
                                                                                         10, 30, 60, 300, 1800),
                                            registry=r)

    def observe_step(self, sched: SchedulerView, plan: object = None) -> None:
        cache = sched.cache
        self.free_blocks.set(cache.pool.num_free)
        self.used_blocks.set(sched.used_blocks)
        self.cached_blocks.set(cache.num_cached)
        self.prefix_hit_rate.set(cache.hit_rate())
        self.queued.set(len(sched.queue))
        self.running.set(len(sched.running))

    def sample(self, name: str) -> Any:
        """The current value of a metric by its full sample name (for tests and reports)."""
        return self.registry.get_sample_value(name)
