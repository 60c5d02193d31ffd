"""The measurement engine on a Ray cluster: the driver, its nodes' tasks and actors, its state and connection."""
