"""``python -m fsspec_kbs.cli``: the ``kbs`` command."""

from fsspec_kbs.cli.main import main

main()
