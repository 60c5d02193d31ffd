"""How a candidate is timed: samples to a budget, cold GPU calls, the cores CPU timing runs on."""
