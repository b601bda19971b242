"""TTFT and decode ms/token over shaped links (1 Gbit/s, 100 Mbit/s) against loopback, per wire codec.

Needs root (network namespaces). The plant: gateway + vision on one box, one decoder stage on each of two more,
rendered by `edgeinspect deploy render` and started from the rendered configuration, as the multi-box test does.
The checkpoint has DeepSeek-VL 1.3B's wire shapes (576 visual tokens x 1024, hidden 2048) but only 2 thin decoder
layers and 1 vision layer, so compute stays small and the bytes on the wire are the real ones: where bandwidth
binds, the codec shows.

Two plants run side by side: the baseline in one namespace (boxes at 127.0.0.1/2/3) and the three boxes in three
namespaces on a tbf-shaped bridge, reshaped between 1 Gbit/s and 100 Mbit/s. Each plant has its vision node and
stages once and one gateway per codec (the codec is a gateway setting: each gateway starts from its codec's
rendering, on its own port). Each gateway gets a warm-up inspection, then `--repeats` rounds visit every
(link, codec) point once each, so drifting load from other jobs falls on all points alike. Every inspection sends
a new image, so the vision cache never hits.

    sudo .venv/bin/python bench/network_bench.py            # -> bench/results/network.json
"""

from __future__ import annotations

import argparse
import io
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml
from common import load_average, machine_info, skip, write_json

from edgeinspect.deploy.labrun import EDGEINSPECT, PlantRun, role_env
from edgeinspect.deploy.netns import Lab, unavailable_reason

TOKEN = "bench-token"
GATEWAY_PORT = 50051
BOXES = ["front", "s0", "s1"]
LOOP_ADDRESSES = {"front": "127.0.0.1", "s0": "127.0.0.2", "s1": "127.0.0.3"}


def wire_shaped_checkpoint(root: Path) -> Path:
    from edgeinspect.models.tiny import TinySpec, make_tiny

    spec = TinySpec(
        layers=2, hidden=2048, heads=16, kv_heads=16, intermediate=256,
        image_size=384, patch_size=16, vision_hidden=1024, vision_layers=1, vision_heads=16, vision_intermediate=256,
    )  # fmt: skip
    return make_tiny(root / "checkpoints" / "wire", spec)


def render(tmp: Path, data_dir: Path, addresses: dict[str, str], codec: str, tokens: int, name: str) -> Path:
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
    (tmp / f"{name}.yaml").write_text(yaml.safe_dump(inv))
    out = tmp / name
    argv = [EDGEINSPECT, "deploy", "render", "-i", tmp / f"{name}.yaml", "-o", out]
    subprocess.run([*argv, "--checkpoint", data_dir / "checkpoints" / "wire"], check=True, capture_output=True)
    return out


def same_backends(renders: dict[str, Path]) -> None:
    """The codec may only change the gateway's settings (else one vision node and stage set cannot serve all)."""
    first, *rest = renders.values()
    for other in rest:
        for path in sorted(first.glob("*/config/*.yaml")):
            if path.name != "gateway.yaml" and path.read_text() != (other / path.relative_to(first)).read_text():
                sys.exit(f"{path.relative_to(first)} differs between codec renderings: the plan depends on the codec")


class Plant:
    """One rendered plant in `lab`: vision + stages once, one gateway per codec on ports 50051, 50052+10, ..."""

    def __init__(self, lab: Lab, renders: dict[str, Path], netns_of: dict[str, str], logs: Path) -> None:
        self.lab, self.netns_of = lab, netns_of
        env = role_env([TOKEN])
        self.runs = [PlantRun(lab, next(iter(renders.values())), env, logs / "backends")]
        self.gateways: dict[str, str] = {}
        for k, (codec, rendered) in enumerate(renders.items()):
            port = GATEWAY_PORT + 100 * k
            gw_env = env | {
                "EDGEINSPECT_SERVER__PORT": str(port),
                "EDGEINSPECT_SERVER__METRICS_PORT": str(port + 1000),
                "EDGEINSPECT_DB_PATH": str(logs / f"reports-{codec}.sqlite"),
            }
            self.runs.append(PlantRun(lab, rendered, gw_env, logs / f"gateway-{codec}"))
            self.gateways[codec] = f"127.0.0.1:{port}"

    def start(self) -> None:
        self.runs[0].start(self.netns_of, roles={"vision", "stage"})
        for run in self.runs[1:]:
            run.start(self.netns_of, roles={"gateway"})

    def wait_healthy(self, timeout_s: float) -> None:
        for run in self.runs:
            run.wait_healthy(timeout_s)

    def inspect(self, codec: str, image: Path) -> dict:
        return self.runs[0].inspect(self.netns_of["front"], self.gateways[codec], image, TOKEN)

    def stop(self) -> None:
        for run in reversed(self.runs):
            run.stop()


def fresh_images(out: Path, count: int) -> list[Path]:
    """`count` distinct photos (the sample parts, one pixel changed per copy): the vision cache never hits."""
    from PIL import Image

    from edgeinspect.assets import asset_path

    names = ["part_ok.jpg", "part_scratch.jpg", "part_dent.jpg", "part_missing_hole.jpg"]
    bases = [Image.open(asset_path(n)).convert("RGB") for n in names]
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(count):
        img = bases[i % len(bases)].copy()
        img.putpixel((i % img.width, 0), (i % 256, (i // 256) % 256, 7))
        buf = io.BytesIO()
        img.save(buf, format="PNG")
        paths.append(out / f"img{i:03d}.png")
        paths[-1].write_bytes(buf.getvalue())
    return paths


def summarize(runs: list[dict]) -> dict:
    """Median and best TTFT, median decode and network ms/token over one point's runs."""
    per_token = [r["per_token_s"] * 1e3 for r in runs if r["per_token_s"] is not None]
    network = [r["network_per_token_s"] * 1e3 for r in runs if r["network_per_token_s"] is not None]
    return {
        "ttft_ms": round(statistics.median(r["ttft_s"] * 1e3 for r in runs), 1),
        "ttft_ms_min": round(min(r["ttft_s"] * 1e3 for r in runs), 1),
        "per_token_ms": round(statistics.median(per_token), 2) if per_token else None,
        "network_per_token_ms": round(statistics.median(network), 2) if network else None,
        "tokens": runs[0]["tokens"],
        "partition": runs[0]["partition"],
        "loadavg_1min": [r["loadavg_1min"] for r in runs],
        "runs": runs,
    }


def run_points(plants: dict[str, Plant], links: list[str], codecs: list[str], images: list[Path], repeats: int):
    """{(link, codec): [run, ...]}: a warm-up per gateway, then `repeats` rounds each visiting every point once,
    so drifting load from other jobs falls on every point alike."""
    for plant in plants.values():
        for codec in codecs:
            plant.inspect(codec, images.pop())  # warm-up: first request on this gateway
    samples: dict[tuple[str, str], list[dict]] = {(link, codec): [] for link in links for codec in codecs}
    for _ in range(repeats):
        for link in links:
            plant = plants["loopback" if link == "loopback" else "boxes"]
            if link != "loopback":
                plant.lab.shape(link)
            for codec in codecs:
                r = plant.inspect(codec, images.pop())
                keep = ("ttft_s", "per_token_s", "network_per_token_s", "tokens", "total_s", "partition")
                samples[(link, codec)].append({k: r[k] for k in keep} | {"loadavg_1min": load_average()[0]})
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--codecs", default="fp32,fp16,int8", help="comma-separated wire codecs")
    parser.add_argument("--links", default="loopback,1gbit,100mbit", help="loopback and/or tc rates (1gbit, ...)")
    parser.add_argument("--tokens", type=int, default=16, help="max_new_tokens per inspection")
    parser.add_argument("--repeats", type=int, default=3, help="measured inspections per point (median)")
    parser.add_argument("--logs", type=Path, default=None, help="keep the roles' logs here (default: discarded)")
    parser.add_argument("--out", type=Path, default=None, help="JSON path (default bench/results/network.json)")
    args = parser.parse_args()
    reason = unavailable_reason()
    if reason:
        skip(f"network namespaces: {reason}")
    codecs = args.codecs.split(",")
    links = args.links.split(",")
    rates = [link for link in links if link != "loopback"]
    info = machine_info(bandwidth=False)
    from edgeinspect.models.onnx_export import export_vision_onnx

    rows = []
    with tempfile.TemporaryDirectory(prefix="netbench-") as tmp_name:
        tmp = Path(tmp_name)
        data_dir = tmp / "data"
        for sub in ("checkpoints", "kb", "reports", "cache", "frames"):
            (data_dir / sub).mkdir(parents=True)
        logs = args.logs or tmp
        ckpt = wire_shaped_checkpoint(data_dir)
        # The rendered vision settings name cache/<checkpoint>-vision.onnx: exported once here rather than by both
        # plants' vision nodes on first start at the same time.
        export_vision_onnx(ckpt, data_dir / "cache" / "wire-vision.onnx")
        images = fresh_images(tmp / "images", len(links) * len(codecs) * args.repeats + 2 * len(codecs))
        plants: dict[str, Plant] = {}
        labs: list[Lab] = []
        try:
            if "loopback" in links:
                labs.append(Lab(["loop"]).up())
                renders = {c: render(tmp, data_dir, LOOP_ADDRESSES, c, args.tokens, f"loop-{c}") for c in codecs}
                same_backends(renders)
                plants["loopback"] = Plant(labs[-1], renders, dict.fromkeys(BOXES, "loop"), logs / "logs-loop")
            if rates:
                labs.append(Lab(BOXES, rates[0]).up())
                addresses = {b: labs[-1].address(b) for b in BOXES}
                renders = {c: render(tmp, data_dir, addresses, c, args.tokens, f"boxes-{c}") for c in codecs}
                same_backends(renders)
                plants["boxes"] = Plant(labs[-1], renders, {b: b for b in BOXES}, logs / "logs-boxes")
            for plant in plants.values():
                plant.start()  # all at once: startup is import-bound, measuring starts when every role is up
            for plant in plants.values():
                plant.wait_healthy(timeout_s=600)
            samples = run_points(plants, links, codecs, images, args.repeats)
            for (link, codec), runs in samples.items():
                m = summarize(runs)
                rows.append({"link": link, "codec": codec, **m})
                print(f"{link:>9} {codec:>5}: TTFT {m['ttft_ms']:8.1f} ms (best {m['ttft_ms_min']:.1f})  "
                      f"{m['per_token_ms']:7.2f} ms/token", flush=True)  # fmt: skip
        finally:
            for plant in plants.values():
                plant.stop()
            for lab in labs:
                lab.down()

    info["loadavg_end"] = load_average()
    meta = {
        "command": "sudo .venv/bin/python bench/network_bench.py " + " ".join(sys.argv[1:]),
        "tokens": args.tokens,
        "repeats": args.repeats,
        "order": "interleaved: each round visits every (link, codec) point once",
        "checkpoint": "wire-shaped: hidden 2048, 576 visual tokens x 1024, 2 decoder layers, 1 vision layer",
        "shaping": "tc tbf rate <link> burst 256kb latency 50ms on both ends of every box's veth",
        "timings": "gateway-measured: time_to_first_token and decode_per_token from the report's timings",
        "machine": info,
    }
    path = write_json("network", {"meta": meta, "rows": rows}, args.out)
    print(
        f"\nwrote {path}\n\n| link | codec | TTFT ms | decode ms/token | network ms/token |\n|---|---|---:|---:|---:|"
    )
    for r in rows:
        cells = [r["link"], r["codec"], f"{r['ttft_ms']:.1f}", f"{r['per_token_ms']:.2f}"]
        print("| " + " | ".join([*cells, f"{r['network_per_token_ms']:.2f}"]) + " |")


if __name__ == "__main__":
    main()
