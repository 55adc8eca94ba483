"""A container's entry point: verify the code objects against the kernel lock, then run the command.

`ENTRYPOINT ["python3", "-m", "netra.deploy.entry"]` in the images; the compose service's command is
the plan's. Before anything starts, every code object the kernel lock lists is hashed under
`$NETRA_BUILD_DIR` (`netra.build.verify_lock`): a missing or tampered one prints each problem and
exits with `REFUSED` (3), so that worker never becomes healthy and the services that depend on it
(its response layer, then the front) are never started. Otherwise the command replaces this
process (same PID, so the launcher's audit reads the command itself); `netra VERB ...` runs as
`python -m netra VERB ...` with this interpreter, exactly as the process launcher runs it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

REFUSED = 3


def main(argv: list[str] | None = None) -> int:
    from netra import settings
    from netra.build import verify_lock
    from netra.deploy.supervisor import resolve_argv

    command = list(sys.argv[1:] if argv is None else argv)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        print("netra.deploy.entry: no command to run", file=sys.stderr)
        return 2
    build_dir = Path(settings.get("NETRA_BUILD_DIR"))
    problems = verify_lock(build_dir)
    if problems:
        print(f"netra: refusing to start {command[:3]}: the code objects under {build_dir} do not match "
              f"the kernel lock:", file=sys.stderr, flush=True)
        for p in problems:
            print(f"  - {p}", file=sys.stderr, flush=True)
        return REFUSED
    exe = resolve_argv(command)
    sys.stdout.flush()
    os.execvp(exe[0], exe)
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
