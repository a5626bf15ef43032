"""Commit protocol: concurrent writers, crashes, repair."""
