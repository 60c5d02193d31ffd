"""The search: the tuning loop, each task's search, which task goes next, stopping, siblings and transfer."""
