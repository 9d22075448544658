"""``python -m tpuprov``: the same as the ``tpuprov`` console script."""

import sys

from tpuprov.main import main

sys.exit(main())
