from __future__ import annotations

import sys

from netra.cli import main

sys.exit(main())
