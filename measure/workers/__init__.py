"""Worker processes: their pipe protocol, their entry point, and the jobs they run."""
