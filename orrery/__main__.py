"""`python -m orrery` is the `orrery` command."""

from orrery.cli import main

main()
