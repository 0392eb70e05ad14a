"""``python -m torchmem``: the ``torchmem`` command (:mod:`torchmem.integrations.cli`)."""

import sys

from torchmem.integrations.cli import main

if __name__ == "__main__":
    sys.exit(main(prog="python -m torchmem"))
