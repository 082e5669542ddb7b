"""`python -m memfit` runs the command line."""

from memfit.cli import run

run()
