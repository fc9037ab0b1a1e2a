"""``python -m chaos.toxiproxy [--host H] [--port P] [--config FILE]``."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], prog="python -m chaos.toxiproxy"))
