"""``python -m ditron.sim -n N script.py [args...]`` (same as ``ditron sim``)."""
import sys

from .launcher import main

sys.exit(main(prog="python -m ditron.sim"))
