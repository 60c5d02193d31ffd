"""Helpers every package shares and none owns: host facts, error lines, lazy exports, Relax rewriting."""
