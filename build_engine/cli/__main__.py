"""``python -m trtforge.build_engine.cli ...``: the same entry as the ``trtforge`` console script."""

from __future__ import annotations

from . import main

if __name__ == "__main__":  # importing this module (a walk over every module) runs nothing
    raise SystemExit(main())
