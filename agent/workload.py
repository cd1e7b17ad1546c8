"""A demo workload: a synthetic "training" loop that checkpoints, resumes and stops cleanly.

    python -m agent.workload --seconds 60 --checkpoint-every 5

Prints one progress line per step (step, loss), writes `$CHECKPOINT_DIR/checkpoint.json` (the
step) every few seconds, resumes from it when RESUME=1, exits 0 when done. On SIGTERM (a
preemption, a resize or a cancel), or when the agent's checkpoint signal file
(`$CHECKPOINT_DIR/stop-requested.json`, `agent.protocol.STOP_FILE`) appears, it writes a final
checkpoint and exits 143. `--ignore-sigterm` leaves SIGTERM to its launcher (as a workload
under a shell that swallows it would), so only the file stops it. `--fail-at STEP` exits 1 at
that step, for tests.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import signal
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

CHECKPOINT_NAME = "checkpoint.json"
STOP_FILE = "stop-requested.json"  # agent.protocol.STOP_FILE (a workload imports nothing of ours)
EXIT_TERMINATED = 143  # 128 + SIGTERM, what a shell reports for a TERM-killed process


def checkpoint_path() -> Path:
    return Path(os.environ.get("CHECKPOINT_DIR") or "checkpoints") / CHECKPOINT_NAME


def load_checkpoint(path: Path) -> dict[str, float] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("step"), int) else None


def save_checkpoint(path: Path, step: int, loss: float) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"step": step, "loss": round(loss, 6), "saved_at": time.time()}))
    os.replace(tmp, path)  # a kill mid-write never leaves a torn checkpoint


def loss_at(step: int, total: int, rng: random.Random) -> float:
    return 2.5 * math.exp(-3.0 * step / max(1, total)) + 0.05 + rng.uniform(-0.02, 0.02)


def stop_reason(path: Path) -> str:
    try:
        return str(json.loads(path.read_text()).get("reason", "?"))
    except (OSError, ValueError):
        return "?"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agent.workload", description=__doc__)
    parser.add_argument("--seconds", type=float, default=60.0, help="total run time")
    parser.add_argument("--step-seconds", type=float, default=0.5, help="time per step")
    parser.add_argument("--checkpoint-every", type=float, default=5.0, help="seconds")
    parser.add_argument("--fail-at", type=int, default=None, help="exit 1 at this step")
    parser.add_argument(
        "--ignore-sigterm", action="store_true", help="stop on the signal file only"
    )
    args = parser.parse_args(argv)

    terminated = threading.Event()

    def on_term(signum: int, frame: FrameType | None) -> None:
        terminated.set()

    signal.signal(signal.SIGTERM, signal.SIG_IGN if args.ignore_sigterm else on_term)
    stop_file = checkpoint_path().parent / STOP_FILE

    total = max(1, math.ceil(args.seconds / args.step_seconds))
    path = checkpoint_path()
    step = 0
    if os.environ.get("RESUME") == "1":
        saved = load_checkpoint(path)
        if saved is not None:
            step = int(saved["step"])
            print(f"resumed from checkpoint at step {step}", flush=True)
        else:
            print("RESUME=1 but no checkpoint found: starting from step 0", flush=True)
    devices = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    shard = f"{os.environ.get('SHARD_INDEX', '0')}/{os.environ.get('SHARD_COUNT', '1')}"
    print(
        f"workload: {total} steps on GPUs [{devices}], shard {shard}", file=sys.stderr, flush=True
    )

    rng = random.Random(step)
    loss = loss_at(step, total, rng)
    last_checkpoint = time.monotonic()
    while step < total:
        if terminated.wait(args.step_seconds) or stop_file.exists():
            save_checkpoint(path, step, loss)
            why = "SIGTERM" if terminated.is_set() else f"stop requested ({stop_reason(stop_file)})"
            print(f"{why}: checkpoint saved at step {step}; exiting", flush=True)
            return EXIT_TERMINATED
        step += 1
        loss = loss_at(step, total, rng)
        print(f"step {step}/{total} loss {loss:.4f}", flush=True)
        if args.fail_at is not None and step >= args.fail_at:
            print(f"failing at step {step} as asked (--fail-at)", file=sys.stderr, flush=True)
            return 1
        if time.monotonic() - last_checkpoint >= args.checkpoint_every:
            save_checkpoint(path, step, loss)
            last_checkpoint = time.monotonic()
    save_checkpoint(path, step, loss)
    print(f"done: {step} steps, final loss {loss:.4f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
