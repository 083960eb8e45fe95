"""`python -m dropbox_eval.schemas --write`: write the shipped schemas afresh."""

import sys
from pathlib import Path

from . import write_all

if sys.argv[1:] != ["--write"]:
    sys.exit("usage: python -m dropbox_eval.schemas --write")
write_all(Path(__file__).parent)
