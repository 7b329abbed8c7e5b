"""Runnable examples of diagnoser (not part of the installed package)."""
