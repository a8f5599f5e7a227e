"""trtforge.build_engine.engine."""
