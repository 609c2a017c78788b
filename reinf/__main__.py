"""``python -m reinf`` is the same as the ``reinf`` command."""
from reinf.cli import main

main(prog_name="reinf")
