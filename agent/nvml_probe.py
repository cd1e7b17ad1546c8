"""`python -m agent.nvml_probe`: print this host's NVML inventory and telemetry as JSON.

Uses the real NVML backend only (never the simulated one): exits 2 with a message where NVML is
absent. Meant to be run once on a real GPU host to check what the agent would report.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence

from agent.gpus import NvmlBackend, NvmlUnavailable


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agent.nvml_probe", description=__doc__)
    parser.add_argument("--samples", type=int, default=1, help="telemetry samples to take")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between samples")
    args = parser.parse_args(argv)
    try:
        backend = NvmlBackend()
    except NvmlUnavailable as exc:
        print(f"NVML is not available on this host: {exc}", file=sys.stderr)
        print(
            "(no NVIDIA driver / libnvidia-ml.so.1 here; the agent would run simulated)",
            file=sys.stderr,
        )
        return 2
    try:
        samples = []
        for i in range(max(1, args.samples)):
            if i:
                time.sleep(args.interval)
            samples.append(backend.sample(set()))
        print(json.dumps({"inventory": backend.inventory(), "samples": samples}, indent=2))
    finally:
        backend.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
