"""``python -m bubblescope`` = the ``bubblescope`` command."""

from .cli import main

main()
