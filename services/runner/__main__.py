"""``python -m services.runner`` / ``gt-runner``."""

from __future__ import annotations

import sys

from services.runner.service import RunnerService
from shared.service.entrypoint import main as run_service


def main() -> int:
    return run_service("runner", RunnerService)


if __name__ == "__main__":
    sys.exit(main())
