"""``python -m trainwise ...``: the ``trainwise`` command (``python -m trainwise run train.py``)."""

import os
import sys

# `python -m trainwise.cli` puts the current folder first on sys.path; the `trainwise` console script does
# not. Drop it so that a user's file named like a module we import (torch.py, numpy.py) is never run by us;
# `fit` adds the folders it needs for factories itself.
if sys.path and sys.path[0] in ("", os.getcwd()):
    del sys.path[0]

from trainwise.cli import main

sys.exit(main())
