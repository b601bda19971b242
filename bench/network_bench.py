"""TTFT and decode ms/token over shaped links (1 Gbit/s, 100 Mbit/s) against loopback, per wire codec.

Needs root (network namespaces). The plant: gateway + vision on one box, one decoder stage on each of two more,
rendered by `edgeinspect deploy render` and started from the rendered configuration, exactly as the multi-box
test does. The checkpoint has DeepSeek-VL 1.3B's wire shapes (576 visual tokens x 1024, hidden 2048) but only
2 thin decoder layers and 1 vision layer, so compute stays small and the bytes on the wire are the real ones:
where bandwidth binds, the codec shows.

    .venv/bin/python bench/network_bench.py            # -> bench/results/network.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from edgeinspect.services.deploy.labrun import EDGEINSPECT, PlantRun, role_env
from edgeinspect.services.deploy.netns import Lab, unavailable_reason

RESULTS = Path(__file__).resolve().parent / "results" / "network.json"
TOKEN = "bench-token"
IMAGES = ["part_ok.jpg", "part_scratch.jpg", "part_dent.jpg", "part_missing_hole.jpg"]


def wire_shaped_checkpoint(root: Path) -> Path:
    from edgeinspect.models.tiny import TinySpec, make_tiny

    spec = TinySpec(
        layers=2, hidden=2048, heads=16, kv_heads=16, intermediate=256,
        image_size=384, patch_size=16, vision_hidden=1024, vision_layers=1, vision_heads=16, vision_intermediate=256,
    )  # fmt: skip
    return make_tiny(root / "checkpoints" / "wire", spec)


def render(tmp: Path, data_dir: Path, addresses: dict[str, str], codec: str, tokens: int) -> Path:
    box = {"memory_gb": 16, "link_gbps": 1}
    inv = {
        "plant": {
            "name": "bench", "data_dir": str(data_dir), "checkpoint": "wire", "weights": "fp32",
            "codec": codec, "max_new_tokens": tokens, "kv_budget_mb": 512,
        },
        "boxes": [
            {"name": "front", "address": addresses["front"], "roles": ["gateway", "vision"], **box},
            {"name": "s0", "address": addresses["s0"], "roles": ["stage"], **box},
            {"name": "s1", "address": addresses["s1"], "roles": ["stage"], **box},
        ],
    }  # fmt: skip
    name = f"{codec}-{addresses['front'].replace('.', '_')}"
    (tmp / f"{name}.yaml").write_text(yaml.safe_dump(inv))
    out = tmp / name
    argv = [EDGEINSPECT, "deploy", "render", "-i", tmp / f"{name}.yaml", "-o", out]
    subprocess.run([*argv, "--checkpoint", data_dir / "checkpoints" / "wire"], check=True, capture_output=True)
    return out


def measure(lab: Lab, netns_of: dict[str, str], rendered: Path, logs: Path, repeats: int) -> dict:
    from edgeinspect.assets import asset_path

    run = PlantRun(lab, rendered, role_env(json.dumps([TOKEN])), logs)
    try:
        run.start(netns_of)
        run.wait_healthy(timeout_s=300)
        port = yaml.safe_load((rendered / "front" / "config" / "gateway.yaml").read_text())["server"]["port"]
        gateway = f"127.0.0.1:{port}"
        # A different image each time: the vision node caches visual tokens by image hash.
        run.inspect(netns_of["front"], gateway, Path(asset_path(IMAGES[0])), TOKEN)  # warm-up
        runs = [
            run.inspect(netns_of["front"], gateway, Path(asset_path(IMAGES[1 + i % 3])), TOKEN) for i in range(repeats)
        ]
    finally:
        run.stop()
    return {
        "ttft_ms": statistics.median(r["ttft_s"] * 1e3 for r in runs),
        "per_token_ms": statistics.median(r["per_token_s"] * 1e3 for r in runs if r["per_token_s"] is not None),
        "tokens": runs[0]["tokens"],
        "runs": runs,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--codecs", default="fp32,fp16,int8", help="comma-separated wire codecs")
    parser.add_argument("--links", default="loopback,1gbit,100mbit", help="loopback and/or tc rates")
    parser.add_argument("--tokens", type=int, default=16, help="max_new_tokens per inspection")
    parser.add_argument("--repeats", type=int, default=3, help="measured inspections per point (median)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    reason = unavailable_reason()
    if reason:
        sys.exit(f"network bench {reason}")

    rows = []
    with tempfile.TemporaryDirectory(prefix="netbench-") as tmp_name:
        tmp = Path(tmp_name)
        data_dir = tmp / "data"
        for sub in ("checkpoints", "kb", "reports", "cache", "frames"):
            (data_dir / sub).mkdir(parents=True)
        wire_shaped_checkpoint(data_dir)
        for link in args.links.split(","):
            names = ["loop"] if link == "loopback" else ["front", "s0", "s1"]
            with Lab(names, "1gbit" if link == "loopback" else link) as lab:
                if link == "loopback":
                    addresses = {"front": "127.0.0.1", "s0": "127.0.0.2", "s1": "127.0.0.3"}
                    netns_of = dict.fromkeys(addresses, "loop")
                else:
                    addresses = {b: lab.address(b) for b in names}
                    netns_of = {b: b for b in names}
                for codec in args.codecs.split(","):
                    rendered = render(tmp, data_dir, addresses, codec, args.tokens)
                    m = measure(lab, netns_of, rendered, tmp / "logs" / f"{link}-{codec}", args.repeats)
                    rows.append({"link": link, "codec": codec, **m})
                    print(f"{link:>9} {codec:>5}: TTFT {m['ttft_ms']:8.1f} ms  {m['per_token_ms']:7.1f} ms/token")

    args.out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"tokens": args.tokens, "repeats": args.repeats, "checkpoint": "wire-shaped (see docstring)"}
    args.out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    print("\n| link | codec | TTFT ms | decode ms/token |\n|---|---|---:|---:|")
    for r in rows:
        print(f"| {r['link']} | {r['codec']} | {r['ttft_ms']:.1f} | {r['per_token_ms']:.1f} |")


if __name__ == "__main__":
    main()
