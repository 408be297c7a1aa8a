"""Scripts the Makefile runs with the repo's venv (not installed with detsweep)."""
