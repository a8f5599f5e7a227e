"""Helpers for tests, importable as ``from trtforge_testing import ...``.

pytest's pythonpath includes tests/_support.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[2]
SHARED = REPO.parent / "shared"

# Every random test input comes from a seeded generator (the ``rng`` fixture, or ``seeded_rng`` where no fixture
# reaches). The base seed is in the pytest header and in a failing test's report; rerun with
#   TRTFORGE_TEST_SEED=<base seed> pytest <test id>
SEED_ENV = "TRTFORGE_TEST_SEED"
BASE_SEED = int(os.environ.get(SEED_ENV) or 20261201)


def seed_for(label: str) -> int:
    """The base seed mixed with a label (a test id, a helper's name), so generators do not share a stream."""
    return (BASE_SEED * 1_000_003 + zlib.crc32(label.encode())) % (1 << 32)


def seeded_rng(label: str) -> np.random.Generator:
    return np.random.default_rng(seed_for(label))


@dataclass
class CliResult:
    code: int
    out: str
    err: str


def run_console(argv: Sequence[str], cwd: Path | None = None, env: dict[str, str] | None = None,
                timeout: float = 600) -> CliResult:
    """Run the installed ``trtforge`` console script in a subprocess (for import-isolation checks)."""
    exe = Path(sys.executable).with_name("trtforge")
    proc = subprocess.run([str(exe), *argv], capture_output=True, text=True, cwd=cwd, env=env, timeout=timeout)
    return CliResult(proc.returncode, proc.stdout, proc.stderr)


def assert_one_line_error(res: CliResult, code: int = 2, *needles: str) -> None:
    """The CLI error contract (build_engine/cli/_common.py): exit code, one 'error:' line on stderr, no traceback."""
    assert res.code == code, (res.code, res.err)
    lines = [ln for ln in res.err.splitlines() if ln.strip()]
    assert len(lines) == 1, res.err
    assert lines[0].startswith("error: "), res.err
    assert "Traceback" not in res.err
    for n in needles:
        assert n in lines[0], (n, lines[0])


def counting_loop(trips_name: str) -> list[Any]:
    """Nodes ``xi = Identity(x); y = Loop(trips_name, "", xi)`` whose body adds 1.0 to a float [1] value each trip and
    passes the condition through (a Loop that runs exactly ``trips_name`` times: the fold ``--check`` tests)."""
    import numpy as np
    from onnx import TensorProto as T
    from onnx import helper as h
    from onnx import numpy_helper as nh

    body = h.make_graph([h.make_node("Add", ["v", "one"], ["v2"]), h.make_node("Identity", ["c"], ["c2"])], "body",
                        [h.make_tensor_value_info("i", T.INT64, []), h.make_tensor_value_info("c", T.BOOL, []),
                         h.make_tensor_value_info("v", T.FLOAT, [1])],
                        [h.make_tensor_value_info("c2", T.BOOL, []), h.make_tensor_value_info("v2", T.FLOAT, [1])],
                        initializer=[nh.from_array(np.array([1.0], np.float32), "one")])
    return [h.make_node("Identity", ["x"], ["xi"]), h.make_node("Loop", [trips_name, "", "xi"], ["y"], body=body)]


def graph_model(nodes: Sequence[Any], inputs: Sequence[tuple[Any, ...]], outputs: Sequence[tuple[Any, ...]],
                inits: Sequence[Any] = (), opsets: Sequence[tuple[str, int]] = (("", 17),)) -> Any:
    """A one-graph model (IR 8) of ``nodes``; ``inputs`` / ``outputs`` are ``make_tensor_value_info`` argument
    tuples (name, elem type, shape)."""
    from onnx import helper as h

    g = h.make_graph(list(nodes), "g", [h.make_tensor_value_info(*i) for i in inputs],
                     [h.make_tensor_value_info(*o) for o in outputs], initializer=list(inits))
    m = h.make_model(g, opset_imports=[h.make_opsetid(d, v) for d, v in opsets])
    m.ir_version = 8
    return m


def assert_fold_check_refused(cli: Any, tmp_path: Path, model: Any, *needles: str) -> None:
    """``trtforge fold --check`` of ``model`` (saved under ``tmp_path``) exits 2 with one line holding ``needles``
    and writes no output."""
    import onnx

    src, out = tmp_path / "in.onnx", tmp_path / "out.onnx"
    onnx.save_model(model, src)
    assert_one_line_error(cli("fold", src, "-o", out, "--check"), 2, *needles)
    assert not out.exists()


def parse_plugin_layers(rtx: Any, path: Any) -> tuple[Any, Any, list[Any]]:
    """Parse ``path`` with TensorRT(-RTX) module ``rtx``'s ONNX parser (plugins registered by the caller); returns the
    builder and network (kept alive together) and the network's IPluginV3 layers, cast so ``.plugin`` is readable."""
    logger = rtx.Logger(rtx.Logger.ERROR)
    builder = rtx.Builder(logger)
    network = builder.create_network(0)
    parser = rtx.OnnxParser(network, logger)
    assert parser.parse_from_file(str(path)), [parser.get_error(i).desc() for i in range(parser.num_errors)]
    layers = []
    for i in range(network.num_layers):
        layer = network.get_layer(i)
        if layer.type == rtx.LayerType.PLUGIN_V3:
            layer.__class__ = rtx.IPluginV3Layer
            layers.append(layer)
    return builder, network, layers


def relu_model_file(path: Path) -> None:
    """A tiny valid model (``y = Relu(x)``, x ``[batch, 8]``) saved at ``path``, for tests that only need a file
    the CLI accepts (build-matrix dry runs, spec checks)."""
    import onnx
    from onnx import TensorProto, helper

    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)


def renamed_profile_file(path: Path, name: str) -> None:
    """The built-in a100 profile written at ``path`` (folders created) under the profile name ``name``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text((REPO / "profiles" / "a100.toml").read_text().replace('name = "a100"', f'name = "{name}"'))
