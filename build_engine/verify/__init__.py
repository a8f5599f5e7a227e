"""trtforge.build_engine.verify."""
