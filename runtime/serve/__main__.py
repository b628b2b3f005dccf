"""``python -m runtime.serve``: the model host of a served room (see runtime/serve/host.py)."""

import sys

from .host import main

sys.exit(main())
