"""``python -m services.witness`` / ``gt-witness``."""

from __future__ import annotations

import sys

from services.witness.service import WitnessService
from shared.service.entrypoint import main as run_service


def main() -> int:
    return run_service("witness", WitnessService)


if __name__ == "__main__":
    sys.exit(main())
