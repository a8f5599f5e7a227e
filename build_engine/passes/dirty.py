"""Which nodes a rewrite may have given a rule something new to find: the marks that let a pass's later walks of one
view visit only those nodes (``walk._apply``, ``ir.GraphCtx.casts``).

Every mutation of the view marks (``Node.touched = ctx.clock``) each node at which a rule's answer may have changed;
a pass that opts in (``incremental = True``) walks, after its first walk, only the Casts marked since the start of its
previous walk. A rule evaluated at a Cast reads (the union over the rules that opt in, each pass's docstring):
- the Cast itself, its input's type and producer (round trip, chain, constant Cast: the inner Cast, the Constant),
  and that producer's input and its type (the round trip's ``x``);
- its output's readers and their read counts, and down a chain of single-reader data-movement ops to the next Cast
  (``sink_cast``, at most ``sink_cast._MAX_CHAIN`` ops);
- the other Casts reading its input (``dedup_cast``, which widens its candidates to whole sibling groups itself).
So a node the view made, or whose outputs were renamed, marks itself, the readers of its outputs, its producers, and
the chain of data-movement ops above each up to and including the node that feeds that chain (``touch``); a node
that reads another value marks itself, that value's producer and chain, its data input's chain (a data-movement
node: the chain test reads its other inputs), and its readers only when it is a Cast (the inner Cast of their
pairs) (``touch_input``); a value whose type changes marks its readers and their chains, and the readers of those
that are Casts (``touch_readers``); a value that loses a reader marks its producer and the chain above it
(``touch_up``). None of them walks a node's inputs or readers on a read's change, so a node read by (or reading)
10k values costs no more per rewrite than any other. The marks are only a filter: a marked node is checked by the
rules in full, so a spurious mark costs time, never exactness, and a missing mark could only leave a rewrite undone
(the test ``test_incremental_rounds.py`` compares the fixed point with that of full walks).
"""

from __future__ import annotations

from typing import Protocol

from .dtypes import DATA_MOVEMENT
from .node import Node, Uses, readers

_MAX_UP = 34  # ``sink_cast._MAX_CHAIN`` data-movement ops, the Cast above them, and one more


class View(Protocol):
    """What the marks read of ``ir.GraphCtx``."""

    clock: int
    producer: dict[str, Node]
    uses: dict[str, Uses]


def touch_up(ctx: View, node: Node | None) -> None:
    """Mark ``node`` and, while the node reached is a data-movement op, the producer of its data input: a chain
    ``Cast -> M_1 -> ... -> M_k`` that ``node`` ends sees the change from its Cast."""
    clock, producer = ctx.clock, ctx.producer
    for _ in range(_MAX_UP):
        if node is None:
            return
        node.touched = clock
        if node.op not in DATA_MOVEMENT or not node.inputs or not node.inputs[0]:
            return
        node = producer.get(node.inputs[0])


def _mark_readers(ctx: View, node: Node) -> None:
    clock, uses = ctx.clock, ctx.uses
    for o in node.outputs:
        d = uses.get(o)
        if d is None:
            continue
        if isinstance(d, dict):
            for r in d:
                r.touched = clock
        else:
            d.touched = clock


def touch_input(ctx: View, node: Node, new: str) -> None:
    """``node`` now reads ``new`` (``GraphCtx.set_input``; for the value it no longer reads, its producer gets
    ``touch_up``)."""
    node.touched = ctx.clock
    if node.to is not None:
        _mark_readers(ctx, node)
    touch_up(ctx, ctx.producer.get(new))
    if node.op in DATA_MOVEMENT and node.inputs and node.inputs[0] and node.inputs[0] != new:
        touch_up(ctx, ctx.producer.get(node.inputs[0]))


def touch(ctx: View, node: Node) -> None:
    """Mark ``node``, the readers of its outputs, the producers of its inputs, and the data-movement chain above it."""
    clock, producer = ctx.clock, ctx.producer
    node.touched = clock
    _mark_readers(ctx, node)
    for i in node.inputs:
        p = producer.get(i) if i else None
        if p is not None:  # ``touch_up`` inlined for the common producer, one that is not data movement
            p.touched = clock
            if p.op in DATA_MOVEMENT:
                touch_up(ctx, p)


def touch_readers(ctx: View, name: str) -> None:
    """``name``'s type changed: mark each node reading it and the chain above it, and the readers of those that are
    Casts (their pairs read ``name``'s type as the inner Cast's input type)."""
    for r in readers(ctx.uses, name):
        touch_up(ctx, r)
        if r.to is not None:
            _mark_readers(ctx, r)
