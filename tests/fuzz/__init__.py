"""Adversarial fuzzer of every read path (issue 19): see ``python -m tests.fuzz --help``."""
