"""`python -m edgeinspect.cli`: the same command as the `edgeinspect` script."""

from edgeinspect.cli import main

main()
