"""`python -m agent`: run the node agent (see agent/README.md)."""

import sys

from agent.main import main

if __name__ == "__main__":
    sys.exit(main())
