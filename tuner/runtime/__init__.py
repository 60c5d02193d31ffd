"""A compiled model as a callable, and run in a process of its own."""
