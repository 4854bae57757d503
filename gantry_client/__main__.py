"""`python -m gantry_client` is the same as the `gantry` command."""

from gantry_client.cli import main

raise SystemExit(main())
