"""trtforge.scheduler.integrations."""
