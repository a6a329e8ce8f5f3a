"""`python -m vramshim ARGS` and the `vramshim` console script: the bundled command."""

import os
import sys

from vramshim import executable


def main():
    """Replaces this process with the bundled `vramshim` command (its exit status and any
    signal that ends it are then the caller's to see)."""
    path = executable()
    if not os.access(path, os.X_OK):
        sys.stderr.write(f"vramshim: the bundled command is missing or not executable: {path}\n")
        sys.exit(2)
    os.execv(path, [path] + sys.argv[1:])


if __name__ == "__main__":
    main()
