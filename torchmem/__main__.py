"""``python -m torchmem``: see :mod:`torchmem._cli` (``run`` a script under torchmem, or the ``demo``)."""

import sys

from torchmem._cli import main

if __name__ == "__main__":
    sys.exit(main())
