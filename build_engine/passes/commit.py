"""``GraphCtx.commit``: write a pass view's result back into the node list it was built from."""

from __future__ import annotations

from functools import partial
from typing import Protocol

from .node import Node, NodeList, Uses


class View(Protocol):
    """What the write-back reads and resets of ``ir.GraphCtx``."""

    nodes: list[Node]
    producer: dict[str, Node]
    uses: dict[str, Uses]
    implicit: dict[str, dict[Node, int]]
    maybe_dead: set[Node] | None
    pass_state: dict[str, object]

    def drop_cast_list(self) -> None: ...


def commit(ctx: View, container: NodeList, *, last: bool = False) -> None:
    """Write the result into ``container``, the node list ``ctx`` was built from (the same protos in the same
    order), as the view's last rewrite: each survivor's rewritten inputs/outputs go into its proto, a node the
    view made (``replace_node``) is copied over the proto it took the place of, and the removed protos are cut
    out without copying any survivor (a stable reorder of the list's message pointers, then a cut at the end).
    Each survivor then reads its proto at its new position: a subgraph's view may still ask this one (its
    parent) about its nodes. ``last``: none will (the graph has no subgraph), so the node list and the
    producer/consumer maps are dropped before the reorder, which makes a wrapper for every proto."""
    nodes = ctx.nodes
    ctx.drop_cast_list()
    ctx.maybe_dead = None
    ctx.pass_state.clear()
    total, kept = len(nodes), 0
    if len(container) != total:
        raise ValueError(f"commit: the view holds {total} nodes, the node list {len(container)}")
    rank: list[int] = []
    for k, n in enumerate(nodes):
        if not n.alive:
            rank.append(total + k)
            continue
        if n.own is not None:
            container[k].CopyFrom(n.own)
            n.own = None
        if n.dirty:
            p = container[k]
            del p.input[:]
            p.input.extend(n.inputs)
            del p.output[:]
            p.output.extend(n.outputs)
            n.dirty = False
        n.src, n.index = container, kept
        rank.append(kept)
        kept += 1
    if last:
        ctx.nodes, ctx.producer, ctx.uses, ctx.implicit = [], {}, {}, {}
        nodes = ctx.nodes  # the removed and kept Node objects go now
    if kept < total:
        # CPython computes sort keys once each, in list order; ``next(keys, proto)`` is the next rank (a C call, not a
        # Python frame per node)
        container.sort(key=partial(next, iter(rank)))
        del container[kept:]
    if not last:
        ctx.nodes = [n for n in ctx.nodes if n.alive]
