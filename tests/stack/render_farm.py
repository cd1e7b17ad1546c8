"""A small pure-Python render farm: an array job's shards render frames, a dependent job merges.

    python3 render_farm.py render OUT_DIR --frames 12     (SHARD_INDEX, SHARD_COUNT from the env)
    python3 render_farm.py merge OUT_DIR --frames 12

Shard i renders frames i, i + n, i + 2n, … of a zoom into the Mandelbrot set as binary PPM
(P6) files, each written to a temporary name and renamed, so a frame on disk is whole. The
merge checks that every frame is there and tiles them into one contact sheet (`sheet.ppm`).
Frames are deterministic: the same frame renders to the same bytes on any node.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

WIDTH, HEIGHT, MAX_ITER = 48, 32, 40
COLUMNS = 4


def frame_pixels(index: int) -> bytes:
    """RGB bytes of frame `index`: the set seen at zoom 1.15^index around a fixed point."""
    zoom = 1.15**index
    cx, cy, span = -0.743643, 0.131825, 3.0 / zoom
    out = bytearray()
    for y in range(HEIGHT):
        for x in range(WIDTH):
            c = complex(cx + (x / WIDTH - 0.5) * span, cy + (y / HEIGHT - 0.5) * span * 2 / 3)
            z, n = 0j, 0
            while abs(z) <= 2 and n < MAX_ITER:
                z = z * z + c
                n += 1
            shade = 255 - n * 255 // MAX_ITER
            out += bytes((shade, (shade * 3) % 256, (index * 20) % 256))
    return bytes(out)


def ppm(width: int, height: int, pixels: bytes) -> bytes:
    return f"P6\n{width} {height}\n255\n".encode() + pixels


def read_ppm(data: bytes) -> tuple[int, int, bytes]:
    magic, size, depth, pixels = data.split(b"\n", 3)
    if magic != b"P6" or depth != b"255":
        raise ValueError("not a binary PPM of 8-bit channels")
    width, height = (int(v) for v in size.split())
    if len(pixels) != width * height * 3:
        raise ValueError("truncated PPM")
    return width, height, pixels


def frame_name(index: int) -> str:
    return f"frame-{index:03d}.ppm"


def render(out: Path, frames: int, shard: int, shards: int, pause: float) -> list[int]:
    mine = list(range(shard, frames, shards))
    (out / f"shard-{shard}.pid").write_text(f"{os.getpid()}\n")
    for index in mine:
        tmp = out / f".{frame_name(index)}.{os.getpid()}"
        tmp.write_bytes(ppm(WIDTH, HEIGHT, frame_pixels(index)))
        tmp.rename(out / frame_name(index))
        print(f"shard {shard}: frame {index} done", flush=True)
        time.sleep(pause)
    return mine


def contact_sheet(frames: list[bytes]) -> bytes:
    """The frames' pixels tiled COLUMNS to a row (missing tiles black) as one PPM."""
    rows = (len(frames) + COLUMNS - 1) // COLUMNS
    width, height = WIDTH * COLUMNS, HEIGHT * rows
    sheet = bytearray(width * height * 3)
    for i, pixels in enumerate(frames):
        top, left = (i // COLUMNS) * HEIGHT, (i % COLUMNS) * WIDTH
        for y in range(HEIGHT):
            start = ((top + y) * width + left) * 3
            sheet[start : start + WIDTH * 3] = pixels[y * WIDTH * 3 : (y + 1) * WIDTH * 3]
    return ppm(width, height, bytes(sheet))


def merge(out: Path, frames: int) -> int:
    missing = [i for i in range(frames) if not (out / frame_name(i)).exists()]
    if missing:
        print(f"missing frames: {missing}", file=sys.stderr)
        return 1
    pixels = [read_ppm((out / frame_name(i)).read_bytes())[2] for i in range(frames)]
    (out / "sheet.ppm").write_bytes(contact_sheet(pixels))
    print(f"merged {frames} frames into sheet.ppm", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("step", choices=["render", "merge"])
    parser.add_argument("out", type=Path)
    parser.add_argument("--frames", type=int, default=12)
    parser.add_argument("--pause", type=float, default=0.0, help="seconds after each frame")
    args = parser.parse_args(argv)
    if args.step == "merge":
        return merge(args.out, args.frames)
    shard, shards = int(os.environ["SHARD_INDEX"]), int(os.environ["SHARD_COUNT"])
    render(args.out, args.frames, shard, shards, args.pause)
    return 0


if __name__ == "__main__":
    sys.exit(main())
