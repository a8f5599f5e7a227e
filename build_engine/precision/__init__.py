"""trtforge.build_engine.precision.convert."""
