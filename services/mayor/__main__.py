"""``python -m services.mayor`` / ``gt-mayor``."""

from __future__ import annotations

import sys

from services.mayor.service import MayorService
from shared.service.entrypoint import main as run_service


def main() -> int:
    return run_service("mayor", MayorService)


if __name__ == "__main__":
    sys.exit(main())
