"""How trtforge runs Polygraphy: quiet, and without importing PyTorch.

Polygraphy asks of every array it handles whether it is a torch tensor (``util.array.is_torch``), and that question
imports torch when it is installed (about 2 s, most of a small ``diff``) inside a bare ``except:`` in
``LazyModule.is_importable``. A Ctrl-C (or SIGTERM) arriving during that import was swallowed there, leaving torch
half-initialised; the next question imported it again and pybind11 aborted the process ("generic_type: cannot
initialize type ... already defined": exit 134, or a segfault, instead of 130/143). onnxruntime runners and
trtforge's feeds are NumPy arrays, so torch is kept out for the block (``sys.modules["torch"] = None``: Python's
documented way to make an import fail), unless something imported it before. A signal another bare ``except:``
swallowed is raised again by ``interrupt.check()`` after the comparison (``diff._compare``).
"""

from __future__ import annotations

import contextlib
import sys
import warnings
from collections.abc import Iterator


@contextlib.contextmanager
def without_torch() -> Iterator[None]:
    """Make ``import torch`` fail for the block (see module docstring); a no-op when torch is already imported."""
    if "torch" in sys.modules:
        yield
        return
    sys.modules["torch"] = None  # type: ignore[assignment]
    try:
        yield
    finally:
        if "torch" in sys.modules and sys.modules["torch"] is None:
            del sys.modules["torch"]


@contextlib.contextmanager
def quiet_polygraphy() -> Iterator[None]:
    """Silence Polygraphy's logger (trtforge prints its own table) and the NumPy RuntimeWarnings its statistics raise
    on inf/NaN outputs (``inf - inf``: five lines of stderr beside the one ``error:`` line of a mismatch), and keep
    torch out (module docstring); errors still surface as exceptions."""
    from polygraphy.logger import G_LOGGER

    old_sev, old_colors = G_LOGGER.module_severity, G_LOGGER.colors
    G_LOGGER.colors = False  # also skips the "'colored' module is not installed" notice
    G_LOGGER.module_severity = G_LOGGER.CRITICAL + 1
    try:
        with warnings.catch_warnings(), without_torch():
            warnings.simplefilter("ignore", RuntimeWarning)
            yield
    finally:
        G_LOGGER.module_severity, G_LOGGER.colors = old_sev, old_colors
