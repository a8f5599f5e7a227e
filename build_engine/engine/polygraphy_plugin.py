"""Polygraphy extension: makes trtforge's TensorRT plugins available to every ``polygraphy`` command.

How Polygraphy 0.53.6 loads it (read from ``polygraphy/tools/_main.py`` and ``polygraphy/tools/run/run.py``):
``polygraphy.tools.main`` builds the parsers of *all* tools before parsing the command line; the ``run`` tool's
``get_subscriptions_impl`` walks ``importlib.metadata.entry_points().select(group="polygraphy.run.plugins")`` and
calls each ``entry_point.load()()`` **with no arguments**, expecting a list of argument groups
(``polygraphy.tools.args.base.BaseArgs`` instances) to add to ``polygraphy run``; an exception is caught and printed
as ``[W] Failed to load plugin: <name>. Note: Error was: ...``. Because every tool's parser is set up at start-up,
the entry point runs for ``polygraphy convert``, ``polygraphy run`` and the rest alike, in the same process and
before any network is parsed. trtforge therefore uses it as a start-up hook: ``register()`` adds no argument
groups (it returns ``[]``) and registers trtforge's plugin creators with the TensorRT module Polygraphy will use.
No Polygraphy internals are patched.

Which module: Polygraphy reads ``POLYGRAPHY_USE_TENSORRT_RTX`` once, at import of ``polygraphy.config``
(``USE_TENSORRT_RTX = os.environ.get(...,"0") != "0"``); ``polygraphy.mod.trt_importer.lazy_import_trt`` then
imports ``tensorrt_rtx`` instead of ``tensorrt``, and ``--compute-capabilities 8.0 8.6`` (only offered when that
variable is set; ``tools/args/backend/trt/config.py``) becomes ``trt.ComputeCapability.SM80/SM86`` targets on the
builder config (``backend/tensorrt_rtx/config.py``). So with the variable set, this hook registers into
``tensorrt_rtx`` and first creates the ``libtensorrt_rtx.so`` link its ONNX parser needs to load plugins
(``trtforge.build_engine.engine.backend.prepare_plugin_loading``); otherwise into ``tensorrt`` if it is installed. When
the chosen module is not installed nothing is imported or registered, so Polygraphy commands that need no TensorRT
stay unaffected.

Thus, with trtforge installed::

    POLYGRAPHY_USE_TENSORRT_RTX=1 polygraphy convert lora.onnx --compute-capabilities 8.0 8.6 -o lora.plan

builds a model with ``LoRAOpPluginDynamic`` nodes, and ``polygraphy run lora.onnx --trt`` finds the creators where
TensorRT and a GPU exist. Polygraphy's ``--plugins LIB.so`` option only ``ctypes.CDLL``-loads shared libraries, which
cannot register Python (``IPluginV3``) creators, so it is not an alternative.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from ..core import env


def polygraphy_uses_rtx() -> bool:
    """What Polygraphy decided (``polygraphy.config.USE_TENSORRT_RTX``), read from the same variable."""
    try:
        from polygraphy import config  # already imported when Polygraphy calls the entry point

        return bool(config.USE_TENSORRT_RTX)
    except ImportError:
        return env.get(env.POLYGRAPHY_USE_TENSORRT_RTX) != "0"


def register_plugins(trt_module: Any | None = None) -> list[str]:
    """Register trtforge's plugin creators with ``trt_module`` (default: the module Polygraphy uses).

    Returns the registered ``namespace::name/version`` strings, or ``[]`` when that module is not installed.
    Raises BackendError when TensorRT-RTX lacks the ``libtensorrt_rtx.so`` link and it cannot be created.
    """
    from trtforge.plugins import register_all

    from .backend import prepare_plugin_loading, select_backend

    if trt_module is None:
        choice, module_name = ("tensorrt-rtx", "tensorrt_rtx") if polygraphy_uses_rtx() else ("tensorrt", "tensorrt")
        if importlib.util.find_spec(module_name) is None:
            return []
        backend = select_backend(choice)
    else:
        choice = "tensorrt-rtx" if trt_module.__name__.startswith("tensorrt_rtx") else "tensorrt"
        backend = select_backend(choice)
    prepare_plugin_loading(backend)
    return list(register_all(backend.module))


def register() -> list[Any]:
    """The ``polygraphy.run.plugins`` entry point (called with no arguments; returns argument groups: none)."""
    register_plugins()
    return []
