"""The engine manifest (``OUTDIR/manifest.json``, format 1; COMMON interface item 6).

Everything downstream (Triton config, kv-plan, diff, the demo) reads the manifest, never the plan, because reading a
plan needs a GPU. ``make_manifest`` is pure data; the builder writes it atomically beside ``model.plan``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .shapes import InputPlan

FORMAT = 1
PLAN_NAME = "model.plan"
MANIFEST_NAME = "manifest.json"
ONNX_NAME = "model.onnx"


@dataclass(frozen=True)
class TensorInfo:
    """An engine input or output as the parsed network sees it (``-1`` marks a dynamic dim)."""

    name: str
    dtype: str
    shape: tuple[int, ...]


def _envelope(plan: InputPlan) -> dict[str, list[int]]:
    """Overall min/max over all optimization profiles; opt is the first profile's opt."""
    mins = [min(r.min[i] for r in plan.ranges) for i in range(len(plan.axes))]
    maxs = [max(r.max[i] for r in plan.ranges) for i in range(len(plan.axes))]
    return {"min": mins, "opt": list(plan.ranges[0].opt), "max": maxs}


def make_manifest(*, backend_name: str, backend_version: str, profile: str, precision: str,
                  compute_capabilities: Sequence[str], inputs: Sequence[TensorInfo],
                  input_plans: Sequence[InputPlan], outputs: Sequence[TensorInfo],
                  plugins: Sequence[dict[str, str]], onnx_sha256: str, plan_sha256: str,
                  build_seconds: float) -> dict[str, Any]:
    plans = {p.spec.name: p for p in input_plans}
    n_profiles = len(input_plans[0].ranges) if input_plans else 0
    ins = []
    for t in inputs:
        entry: dict[str, Any] = {"name": t.name, "dtype": t.dtype, "shape": list(t.shape)}
        plan = plans.get(t.name)
        if plan is not None:
            entry.update(_envelope(plan))
            entry["profiles"] = [{"min": list(r.min), "opt": list(r.opt), "max": list(r.max)} for r in plan.ranges]
        ins.append(entry)
    return {
        "format": FORMAT,
        "plan": PLAN_NAME,
        "backend": {"name": backend_name, "version": backend_version},
        "profile": profile,
        "precision": precision,
        "compute_capabilities": list(compute_capabilities),
        "inputs": ins,
        "outputs": [{"name": t.name, "dtype": t.dtype, "shape": list(t.shape)} for t in outputs],
        "optimization_profiles": n_profiles,
        "plugins": list(plugins),
        "onnx_sha256": onnx_sha256,
        "plan_sha256": plan_sha256,
        "build_seconds": round(build_seconds, 3),
    }
