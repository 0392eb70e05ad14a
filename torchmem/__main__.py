"""``python -m torchmem``: see :mod:`torchmem.integrations.cli` (``run`` a script under torchmem, or the ``demo``)."""

import sys

from torchmem.integrations.cli import main

if __name__ == "__main__":
    sys.exit(main())
