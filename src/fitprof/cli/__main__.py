"""``python -m fitprof.cli``: the ``fitprof`` command."""

from fitprof.cli import main

raise SystemExit(main())
