"""build-matrix on a Ray cluster whose only node with trtforge's resources has no CPU (a head started with
--num-cpus=0, as KubeRay heads are): the cluster's totals held the resource, so every cell's task (1 CPU and one
unit of the resource, on one node) was submitted and stayed pending forever. Such a cell is refused at once."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from trtforge.examples.make_example import write_example

pytest.importorskip("tensorrt_rtx", reason="TensorRT-RTX builds the engines (pip install 'trtforge[rtx]')")
pytest.importorskip("ray", reason="the Ray executor needs ray (pip install 'trtforge[cluster]')")


def test_resource_only_on_a_node_without_cpus_is_refused_not_pending(tmp_path: Path) -> None:
    import ray

    from trtforge.build_engine.matrix.cells import node_resources
    from trtforge.build_engine.matrix.driver import run_matrix
    from trtforge.build_engine.matrix.spec import load_matrix

    write_example(tmp_path / "m", seed=23)
    matrix = tmp_path / "mx.toml"
    matrix.write_text('[matrix]\nprofiles = ["a10"]\n[[model]]\npath = "m/llama_fp32.onnx"\nname = "llama"\n')
    done: dict[str, Any] = {}
    ctx = ray.init(num_cpus=0, resources=node_resources(), include_dashboard=False, log_to_driver=False,
                   configure_logging=False)
    try:
        def run() -> None:
            try:
                done["report"] = run_matrix(load_matrix(matrix), tmp_path / "out", executor="ray",
                                            address=ctx.address_info["gcs_address"])
            except BaseException as exc:  # noqa: BLE001 - handed to the test thread
                done["error"] = exc

        worker = threading.Thread(target=run, daemon=True)
        worker.start()
        worker.join(timeout=60)
        assert not worker.is_alive(), "the cell's task stayed pending on a cluster where it cannot run"
    finally:
        ray.shutdown()
    assert "error" not in done, done.get("error")
    (cell,) = done["report"].cells
    assert cell.status == "refused" and "'trtforge_rtx' beside a CPU" in cell.reason, cell.reason
    assert not (tmp_path / "out" / "llama").exists()
