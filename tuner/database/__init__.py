"""The tuning database and the work dir that holds it."""
