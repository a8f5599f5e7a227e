"""Sort once per forward (issue 17 item 5): lora_prepare's table, built once, read by every LoRA node of a forward.

The kernels run as the NumPy mirror of kernel.cu (tests/_support/lora_kernel_mirror.py; no GPU here); which node
prepares and which buffer each node reads is decided by the plugin's own ForwardMeta, exactly as
small_launch.run_variant asks it. Results are checked against the float64 reference (slot -1 / out-of-range rows
bit-exact).
"""

from __future__ import annotations

import numpy as np
from lora_kernel_mirror import check, fused_launch, make_case, prepare_launch

from trtforge.plugins.lora import spec
from trtforge.plugins.lora.forward_meta import ForwardMeta, Role
from trtforge.plugins.lora.launch import max_chunks, meta_bytes, plan_launch


def _forward(registry: ForwardMeta, nodes: list[dict], metas: dict[int, np.ndarray], scratches: list[np.ndarray],
             ids: np.ndarray, stream: int, seed: int) -> tuple[int, list[np.ndarray]]:
    """One forward: every node enqueues in order on ``stream``; returns (prepares launched, outputs)."""
    prepares, outs = 0, []
    for i, case in enumerate(nodes):
        f = case["fields"]
        tokens = int(np.prod(case["x"].shape[:-1]))
        rng = np.random.default_rng(seed + i)
        role = registry.role((7, stream, 0xA000, tokens, 1, f.num_slots), owner=100 + i, meta=1000 + i)
        if role.prepare:
            prepares += 1
            prepare_launch(metas[role.meta], ids, tokens, 1, f.num_slots, max_chunks(tokens, f.num_slots), rng)
        p = plan_launch(f, tokens, "float16", sm_count=132)
        y = case["y"].reshape(-1).copy()
        fused_launch(scratches[i], case["x"].reshape(-1), y, case["a"].reshape(-1), case["b"].reshape(-1), ids,
                     case["scales"], 1, p, f, rng, resident=6, meta=metas[role.meta])
        assert not scratches[i][:4].any(), "control words must be zero after every launch"
        outs.append(y)
    return prepares, outs


def test_metadata_built_once_per_forward_for_all_nodes():
    """4 LoRA nodes (own weights, shared slot_ids), 3 forwards with new slot ids and token counts: one prepare per
    forward, by the same node, and every node's output matches float64 reading that node's table."""
    registry = ForwardMeta()
    n_slots, h, o = 5, 96, 72
    scratch_words = plan_launch(spec.LoraFields(8, n_slots, h, o, 32), 40, "float16", sm_count=132).scratch_bytes
    scratches = [np.zeros(scratch_words, np.int32) for _ in range(4)]
    metas = {1000 + i: np.full(meta_bytes(40, n_slots) // 4, -7, np.int32) for i in range(4)}
    for fwd, tokens in enumerate((40, 40, 23)):
        nodes = [make_case(tokens, h, o, 8, 8, n_slots, "float16", seed=10 * fwd + i) for i in range(4)]
        g = np.random.default_rng(99 + fwd)
        ids = g.integers(-1, n_slots + 1, size=tokens).astype(np.int32)  # -1 and out of range: no adapter
        prepares, outs = _forward(registry, nodes, metas, scratches, ids, stream=3, seed=fwd)
        assert prepares == 1
        for case, y in zip(nodes, outs, strict=True):
            case["ids"] = ids
            check(case, y, "float16", ids)
    assert len(registry) == 2  # one leader per batch shape (40 and 23 tokens)


def test_leader_per_stream_shape_and_context():
    r = ForwardMeta()
    key = (1, 5, 0xB000, 64, 1, 8)
    assert r.role(key, owner=1, meta=11) == Role(True, 11)
    assert r.role(key, owner=2, meta=22) == Role(False, 11)
    assert r.role(key, owner=1, meta=11) == Role(True, 11)  # next forward: the same leader prepares again
    aux = (1, 6, 0xB000, 64, 1, 8)  # another stream is not ordered after the leader: its own leader and buffer
    assert r.role(aux, owner=2, meta=22) == Role(True, 22)
    other_ctx = (2, 5, 0xB000, 64, 1, 8)
    assert r.role(other_ctx, owner=3, meta=33) == Role(True, 33)
    assert r.role((1, 5, 0xB000, 64, 1, 9), owner=4, meta=0) == Role(False, 0)  # no buffer: sorts by itself
    r.forget(1)  # the leader is destroyed: nobody may read its buffer again
    assert r.role(key, owner=2, meta=22) == Role(True, 22)


def test_prepare_table_is_the_stable_sort_by_slot():
    """lora_prepare's order is tokens grouped by slot, ascending slot; chunks of <= 16 tokens of one slot."""
    n, tokens = 4096, 3000
    ids = np.random.default_rng(5).integers(-1, 40, size=tokens).astype(np.int32)
    mc = max_chunks(tokens, n)
    meta = np.full(meta_bytes(tokens, n) // 4, -7, np.int32)
    prepare_launch(meta, ids, tokens, 1, n, mc, np.random.default_rng(6))
    m = 4  # LORA_META_WORDS
    c = int(meta[0])
    start, length, slot = meta[m:m + c], meta[m + mc:m + mc + c], meta[m + 2 * mc:m + 2 * mc + c]
    order = meta[m + 3 * mc:m + 3 * mc + tokens]
    used = ids >= 0
    want_slots = np.sort(ids[used], kind="stable")
    got = order[:used.sum()]
    assert np.array_equal(ids[got], want_slots) and sorted(got.tolist()) == np.flatnonzero(used).tolist()
    assert (length >= 1).all() and (length <= 16).all() and length.sum() == used.sum()
    assert np.array_equal(start, np.concatenate([[0], np.cumsum(length)[:-1]]))
    assert all((ids[order[s:s + ln]] == sl).all() for s, ln, sl in zip(start, length, slot, strict=True))
