"""trtforge.build_engine.core."""
