"""`python -m kvserve.loadtests.compare.peers`: the side-by-side run of peers.py."""
import sys

from .peers import main

sys.exit(main())
