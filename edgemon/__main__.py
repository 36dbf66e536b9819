"""`python -m edgemon` is the `edgemon` command."""

from __future__ import annotations

from edgemon.cli.main import main

raise SystemExit(main())
