"""Prefill A/B: this working tree against an earlier revision, on the same box in one run, processes alternating.

One round = one process per side (the revision from a `git worktree` of it, this tree as installed), each loading
the same checkpoint in one format and timing `--repeats` prefills of the gateway's inspection prompt (~974 tokens at
1.3B: chat template, ~300 tokens of sample-KB spec context, 576 image placeholders with fixed random visual tokens)
after one untimed one. Sides alternate round by round, so drifting load lands on both. Each side also reports its
first-token logits cosine against an fp32 stage of the same tree run once (the accuracy the change costs or buys).

    .venv/bin/python bench/prefill_ab.py --checkpoint CKPT --against REV [--rounds 3] [--repeats 4] [--weights int8]

The child side reads the package from the worktree by pointing setuptools' editable-install finder (how
`tools/setup.sh` installs edgeinspect) at it; with any other install, the child refuses to run rather than time
this tree twice.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CKPT = ROOT / "var" / "checkpoints" / "deepseek-vl-1.3b"


def point_package_at(tree: Path) -> None:
    """Makes `import edgeinspect` read `tree` in this process: setuptools' editable finder (imported at start-up by
    its .pth file) maps each package to a folder of this checkout: its MAPPING is pointed at the same folders of
    tree."""
    finders = [m for name, m in sys.modules.items() if name.startswith("__editable___edgeinspect")]
    if not finders or not hasattr(finders[0], "MAPPING"):
        raise SystemExit("prefill_ab: edgeinspect is not an editable install here; cannot load another revision")
    mapping = finders[0].MAPPING
    for name, path in mapping.items():
        mapping[name] = str(tree / Path(path).relative_to(ROOT))


def child(args) -> None:
    """One side: load, time the prefills, print one JSON line."""
    if args.tree != str(ROOT):
        point_package_at(Path(args.tree))
    import torch

    sys.path.insert(0, str(ROOT / "bench"))
    from common import inspection_prompt

    import edgeinspect
    from edgeinspect.models.checkpoint import open_checkpoint
    from edgeinspect.models.stage import LayerRange, StageExecutor, StepInput, load_stage

    assert Path(edgeinspect.__file__).resolve().is_relative_to(Path(args.tree).resolve()), edgeinspect.__file__
    torch.set_num_threads(args.threads)
    ckpt = open_checkpoint(args.checkpoint)
    ids, visual = inspection_prompt(ckpt, args.context_tokens)
    whole = LayerRange(0, ckpt.num_layers, ckpt.num_layers)
    ex = StageExecutor(load_stage(ckpt, whole, args.weights))

    def prefill():
        ex.open("ab", capacity=len(ids) + 1)
        t0 = time.perf_counter()
        out = ex.step([("ab", StepInput(position=0, input_ids=torch.tensor(ids), visual_tokens=visual))])[0]
        dt = time.perf_counter() - t0
        ex.release("ab")
        return dt, out.logits

    prefill()
    times, logits = [], None
    for _ in range(args.repeats):
        dt, logits = prefill()
        times.append(dt)
    if args.save_logits:
        torch.save(logits, args.save_logits)
    cos = None
    if args.reference and Path(args.reference).is_file():
        ref = torch.load(args.reference)
        cos = float(torch.nn.functional.cosine_similarity(logits.double(), ref.double(), dim=0))
    print(json.dumps({"times_s": [round(t, 4) for t in times], "prompt_tokens": len(ids), "cosine_vs_fp32": cos}))


def run_side(tree: Path, args, weights: str, extra: list[str]) -> dict:
    cmd = [sys.executable, __file__, "--child", "--tree", str(tree), "--checkpoint", str(args.checkpoint)]
    cmd += ["--weights", weights, "--repeats", str(args.repeats), "--threads", str(args.threads)]
    cmd += ["--context-tokens", str(args.context_tokens), *extra]
    out = subprocess.run(
        cmd, check=True, capture_output=True, text=True, env={**os.environ, "PYTHONWARNINGS": "ignore"}
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", type=Path, default=DEFAULT_CKPT)
    ap.add_argument("--against", default="HEAD", help="the git revision to compare this working tree with")
    ap.add_argument("--weights", default="int8")
    ap.add_argument("--rounds", type=int, default=3, help="processes per side, alternating")
    ap.add_argument("--repeats", type=int, default=4, help="timed prefills per process (after one untimed)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--context-tokens", type=int, default=300)
    ap.add_argument("--out", type=Path, default=None, help="JSON (default bench/results/prefill_ab.json)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--tree", default=str(ROOT), help=argparse.SUPPRESS)
    ap.add_argument("--reference", help=argparse.SUPPRESS)
    ap.add_argument("--save-logits", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args)
    sys.path.insert(0, str(ROOT / "bench"))
    from common import load_average, machine_info, require_checkpoint, write_json

    require_checkpoint(args.checkpoint)
    rev = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", args.against], check=True, capture_output=True, text=True
    )
    commit = rev.stdout.strip()
    machine = machine_info()
    with tempfile.TemporaryDirectory(prefix="prefill-ab-") as tmp:
        tree = Path(tmp) / "tree"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(tree), commit], check=True)
        try:
            reference = Path(tmp) / "fp32.pt"
            print(f"fp32 reference logits (this tree), {args.checkpoint}", flush=True)
            run_side(ROOT, args, "fp32", ["--save-logits", str(reference)])
            sides: dict[str, list[dict]] = {"before": [], "after": []}
            for r in range(args.rounds):
                for name, where in (("before", tree), ("after", ROOT)):
                    got = run_side(where, args, args.weights, ["--reference", str(reference)])
                    sides[name].append(got)
                    print(f"round {r} {name}: {got['times_s']} s, cosine vs fp32 {got['cosine_vs_fp32']}", flush=True)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=False)
    medians = {k: statistics.median(t for run in v for t in run["times_s"]) for k, v in sides.items()}
    payload = {
        "benchmark": "prefill_ab",
        "machine": machine,
        "checkpoint": str(args.checkpoint),
        "weights": args.weights,
        "before": {"revision": commit, "runs": sides["before"], "median_s": round(medians["before"], 4)},
        "after": {"revision": "working tree", "runs": sides["after"], "median_s": round(medians["after"], 4)},
        "after_over_before": round(medians["after"] / medians["before"], 4),
        "prompt_tokens": sides["after"][0]["prompt_tokens"],
        "loadavg_end": load_average(),
    }
    print(f"prefill {args.weights}: before {medians['before']:.3f} s, after {medians['after']:.3f} s "
          f"({payload['after_over_before']:.3f}x)")  # fmt: skip
    print(f"-> {write_json('prefill_ab', payload, args.out)}")


if __name__ == "__main__":
    main()
