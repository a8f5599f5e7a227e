"""trtforge.scheduler.sim."""
