"""`python -m maskedrnn`: the demo of `maskedrnn.demo` (see `--help`)."""

import sys

from maskedrnn.demo import main

if __name__ == "__main__":
    sys.exit(main())
