"""Ingest cost: decode + sample per 1080p30 stream (CPU seconds per second of video), and how many mostly
static streams one core follows in real time with change gating.

The clip: the sample conveyor scaled to 1920x1080 at 30 fps, 10 s, one part passing in the first 1.3 s and a
still belt (with sensor noise) after, encoded as MPEG-4 part 2 (mp4v, what OpenCV writes) and as H.264 (what IP
cameras send; needs Debian's ffmpeg). Baselines in the same run: decode alone (the floor), and decode + JPEG
encoding of every frame (what ingest would pay without sampling).

Run: .venv/bin/python bench/ingest_bench.py [--seconds 10] [--out bench/results/ingest.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import cv2
import numpy as np

from edgeinspect.assets import asset_path
from edgeinspect.services.ingest.config import GatingConfig, SamplingConfig
from edgeinspect.services.ingest.delivery import encode_jpeg
from edgeinspect.services.ingest.sampling import Sampler
from edgeinspect.services.ingest.sources import CaptureSource, SourceKind, SourceSpec

SIZE = (1920, 1080)
FPS = 30


def make_clip(folder: Path, seconds: int) -> dict[str, Path]:
    """Writes the 1080p30 clip as mp4v (and H.264 when ffmpeg is installed); returns codec -> path."""
    cap = cv2.VideoCapture(str(asset_path("conveyor.mp4")))
    src = []
    while len(src) < 40:  # one part: enter, dwell, leave, empty belt
        ok, frame = cap.read()
        if not ok:
            break
        src.append(cv2.resize(frame, SIZE, interpolation=cv2.INTER_LINEAR))
    cap.release()
    rng = np.random.default_rng(0)
    path = folder / "clip_mp4v.mp4"
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), FPS, SIZE)
    for t in range(seconds * FPS):
        base = src[min(t, len(src) - 1)]  # a part passes in the first 1.3 s, then the belt stands still
        noise = rng.normal(0, 2.0, base.shape).astype(np.float32)
        writer.write(np.clip(base + noise, 0, 255).astype(np.uint8))
    writer.release()
    clips = {"mp4v": path}
    if shutil.which("ffmpeg"):
        h264 = folder / "clip_h264.mp4"
        subprocess.run(
            ["ffmpeg", "-hide_banner", "-loglevel", "error", "-y", "-i", str(path), "-c:v", "libx264",
             "-preset", "veryfast", "-g", "60", "-pix_fmt", "yuv420p", str(h264)],
            check=True,
        )  # fmt: skip
        clips["h264"] = h264
    return clips


def spec(path: Path, realtime: bool) -> SourceSpec:
    return SourceSpec(kind=SourceKind.file, location=str(path), realtime=realtime)


def cpu_per_video_second(path: Path, seconds: int, mode: str) -> dict:
    """Reads the whole clip as fast as it decodes; mode: decode | gating | jpeg_every_frame."""
    source = CaptureSource(spec(path, realtime=False))
    sampler = Sampler(SamplingConfig(gating=GatingConfig()))
    cpu0, wall0 = time.process_time(), time.perf_counter()
    frames = inspected = 0
    while (image := source.read()) is not None:
        if mode == "gating":
            inspected += sampler.decide(frames, frames / FPS, image).inspect
        elif mode == "jpeg_every_frame":
            encode_jpeg(image, 90)
            inspected += 1
        frames += 1
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    source.close()
    return {
        "mode": mode,
        "frames": frames,
        "inspected": inspected,
        "cpu_s_per_video_s": round(cpu / seconds, 4),
        "decode_fps": round(frames / wall, 1),
    }


def follow_streams(path: Path, streams: int, seconds: int, core: int) -> dict:
    """`streams` real-time readers of the clip with change gating, all pinned to one core: do they keep up?"""
    os.sched_setaffinity(0, {core})
    counts = [0] * streams
    lag = [0.0] * streams

    def reader(i: int) -> None:
        source = CaptureSource(spec(path, realtime=True))
        sampler = Sampler(SamplingConfig(gating=GatingConfig()))
        start = time.monotonic()
        while (image := source.read()) is not None:
            sampler.decide(counts[i], time.time(), image)
            counts[i] += 1
        lag[i] = time.monotonic() - start - seconds  # > 0: fell behind the camera
        source.close()

    cpu0 = time.process_time()
    threads = [threading.Thread(target=reader, args=(i,)) for i in range(streams)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    cpu = time.process_time() - cpu0
    os.sched_setaffinity(0, set(range(os.cpu_count() or 1)))
    return {
        "streams": streams,
        "frames_per_stream": min(counts),
        "worst_lag_s": round(max(lag), 2),
        "kept_up": max(lag) < 0.5,  # within half a second of the camera over the whole clip
        "core_busy": round(cpu / (seconds + max(0.0, max(lag))), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=10, help="clip length")
    parser.add_argument("--out", type=Path, default=Path("bench/results/ingest.json"), help="JSON output")
    args = parser.parse_args()
    results: dict = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "opencv": cv2.__version__},
        "clip": {"size": list(SIZE), "fps": FPS, "seconds": args.seconds},
        "cost": {},
        "streams_per_core": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        clips = make_clip(Path(tmp), args.seconds)
        for codec, path in clips.items():
            rows = [cpu_per_video_second(path, args.seconds, m) for m in ("decode", "gating", "jpeg_every_frame")]
            results["cost"][codec] = rows
            for r in rows:
                print(codec, r)
            share = rows[1]["cpu_s_per_video_s"]
            estimate = max(1, int(1.0 / share))
            trials = []
            for n in sorted({max(1, estimate - 1), estimate, estimate + 1}):
                trials.append(follow_streams(path, n, args.seconds, core=0))
                print(codec, trials[-1])
            kept = [t["streams"] for t in trials if t["kept_up"]]
            results["streams_per_core"][codec] = {
                "estimate_from_cpu_share": round(1.0 / share, 2),
                "trials": trials,
                "max_streams_kept_up": max(kept) if kept else 0,
            }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
