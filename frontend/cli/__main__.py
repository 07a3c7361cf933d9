"""`python -m kvserve.frontend.cli`: the same as the `kvserve` command."""
from kvserve.frontend.cli.commands import main

raise SystemExit(main())
