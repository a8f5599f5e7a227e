"""trtforge.scheduler.cache: a response cache in front of the scheduler (L1 in-process, L2 Redis, L3 FAISS).

``keys`` (the key contract), ``entry`` (configuration and the stored value), ``l1`` (bounded LRU with per-entry
TTL), ``l2`` (Redis: pooled, pipelined buffered writes, stale-while-revalidate, outage degradation), ``l3``
(FAISS similarity over a pluggable embedding), ``pubsub`` (version invalidation across replicas), ``metrics``
(prometheus), ``front`` (``ResponseCache``: the tiers together, what the request path and the simulator use).
Heavy modules (cachetools, redis, faiss, prometheus_client) are imported when a tier is created.
"""
