"""DOPpler's degree-of-parallelism controller, and what it learned, remembered per machine."""
