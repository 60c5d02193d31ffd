"""The best schedules applied and compiled into a model that no kernel can sink, checked end to end."""
