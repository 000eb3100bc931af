"""`python -m sapiens2`: the command line."""

import sys

from sapiens2.cli import main

if __name__ == "__main__":
    sys.exit(main())
