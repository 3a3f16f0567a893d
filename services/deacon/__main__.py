"""``python -m services.deacon`` / ``gt-deacon``."""

from __future__ import annotations

import sys

from services.deacon.service import DeaconService
from shared.service.entrypoint import main as run_service


def main() -> int:
    return run_service("deacon", DeaconService)


if __name__ == "__main__":
    sys.exit(main())
