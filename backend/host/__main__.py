"""`python -m kvserve.backend.host`: the same entry point as `kvserve triton`."""
from __future__ import annotations

import sys

from .server import main

sys.exit(main())
