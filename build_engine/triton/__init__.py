"""trtforge.build_engine.triton."""
