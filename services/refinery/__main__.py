"""``python -m services.refinery`` / ``gt-refinery``."""

from __future__ import annotations

import sys

from services.refinery.service import RefineryService
from shared.service.entrypoint import main as run_service


def main() -> int:
    return run_service("refinery", RefineryService)


if __name__ == "__main__":
    sys.exit(main())
