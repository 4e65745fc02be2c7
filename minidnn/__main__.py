"""`python -m minidnn ...` runs the command line (same as the `minidnn` command)."""
from .cli import main

raise SystemExit(main())
