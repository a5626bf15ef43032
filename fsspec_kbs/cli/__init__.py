"""The ``kbs`` command line."""
