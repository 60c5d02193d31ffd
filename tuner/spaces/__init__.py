"""Design spaces: MetaSchedule's building blocks behind one interface, our schedule rules and register tiles."""
