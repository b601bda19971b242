"""The human-readable report: Markdown beside the JSON, the confusion matrix and per-class bars as pictures
(matplotlib, Agg: no display on an edge box), and the worst misses with their frames."""

from __future__ import annotations

from pathlib import Path

from edgeinspect.services.evaluation.scoring import RATE_NAMES

MAX_MISSES = 12
THUMB_PX = 256


def _pct(r: dict) -> str:
    if r["value"] is None:
        return f"n/a (0 of {r['n']})"
    return f"{r['value']:.1%} ({r['k']}/{r['n']}; 95% CI {r['low']:.1%}-{r['high']:.1%})"


def confusion_picture(metrics: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    conf = metrics["confusion"]
    rows, cols, counts = conf["rows"], conf["columns"], conf["counts"]
    fig, ax = plt.subplots(figsize=(1.6 + 1.3 * len(cols), 1.0 + 0.5 * max(1, len(rows))))
    ax.imshow(counts or [[0] * len(cols)], cmap="Blues", aspect="auto")
    ax.set_xticks(range(len(cols)), cols)
    ax.set_yticks(range(len(rows)), rows)
    ax.set_xlabel("verdict")
    ax.set_ylabel("truth")
    top = max((c for row in counts for c in row), default=0)
    for i, row in enumerate(counts):
        for j, c in enumerate(row):
            ax.text(j, i, str(c), ha="center", va="center", color="white" if c > top / 2 else "black")
    ax.set_title("confusion matrix (parts)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def per_class_picture(metrics: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(metrics["per_class"])
    fig, ax = plt.subplots(figsize=(2 + 1.1 * max(1, len(names)), 3.2))
    width = 0.38
    for offset, key in ((-width / 2, "recall"), (width / 2, "precision")):
        vals, lows, highs = [], [], []
        for n in names:
            r = metrics["per_class"][n][key]
            v = r["value"] or 0.0
            vals.append(v)
            lows.append(v - (r["low"] or 0.0) if r["value"] is not None else 0.0)
            highs.append((r["high"] or 0.0) - v if r["value"] is not None else 0.0)
        xs = [i + offset for i in range(len(names))]
        ax.bar(xs, vals, width, yerr=[lows, highs], capsize=3, label=key)
    ax.set_xticks(range(len(names)), names, rotation=20, ha="right")
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("rate (95% CI)")
    ax.legend(loc="upper right", fontsize=8)
    ax.set_title("per-class recall and precision")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _thumbnail(src: Path, dst: Path) -> bool:
    from PIL import Image

    try:
        with Image.open(src) as img:
            img = img.convert("RGB")
            img.thumbnail((THUMB_PX, THUMB_PX))
            img.save(dst, "JPEG", quality=85)
        return True
    except OSError:
        return False


def write_markdown(result: dict, out: Path, image_root: Path | None, regressions: list[str] | None = None) -> Path:
    """out/report.md with out/confusion.png, out/per_class.png and out/misses/*.jpg; returns the Markdown path."""
    m = result["metrics"]
    confusion_picture(m, out / "confusion.png")
    per_class_picture(m, out / "per_class.png")
    lines = [
        f"# Evaluation: {result['dataset']['path']}",
        "",
        f"{m['counts']['images']} parts ({m['counts']['good']} good, {m['counts']['defect']} defective), "
        f"{m['counts']['errors']} failed; part {result['dataset']['part'] or 'all'}.",
        "",
        "| metric | value |",
        "|---|---|",
    ]
    lines += [f"| {name} | {_pct(m[name])} |" for name in RATE_NAMES]
    lat = m["latency_ms"]
    for q in ("p50", "p99"):
        if lat[q]["value"] is not None:
            lines.append(
                f"| latency {q} | {lat[q]['value']:.0f} ms (n={lat['n']}; 95% CI {lat[q]['low']:.0f}-"
                f"{lat[q]['high']:.0f} ms) |"
            )
    if "anomaly" in result:
        lines += anomaly_lines(result["anomaly"])
    if regressions is not None:
        lines += ["", "## Gate", ""] + ([f"- FAIL: {r}" for r in regressions] or ["- PASS against the baseline"])
    lines += ["", "## Measured", ""]
    lines += [f"- {k}: {', '.join(v) if v else 'not reported'}" for k, v in result["measured"].items()]
    lines += ["", "## Confusion matrix", "", "![confusion matrix](confusion.png)", ""]
    lines += ["| truth \\ verdict | " + " | ".join(m["confusion"]["columns"]) + " |"]
    lines += ["|---" * (len(m["confusion"]["columns"]) + 1) + "|"]
    for row, counts in zip(m["confusion"]["rows"], m["confusion"]["counts"], strict=True):
        lines.append(f"| {row} | " + " | ".join(str(c) for c in counts) + " |")
    lines += ["", "## Per class", "", "![per-class recall and precision](per_class.png)", ""]
    lines += ["| class | support | recall | precision |", "|---|---|---|---|"]
    for cls, r in m["per_class"].items():
        lines.append(f"| {cls} | {r['support']} | {_pct(r['recall'])} | {_pct(r['precision'])} |")
    lines += ["", "## Worst misses", ""]
    misses = result["misses"][:MAX_MISSES]
    if not misses:
        lines.append("None.")
    frames = out / "misses"
    frames.mkdir(exist_ok=True)
    for k, miss in enumerate(misses):
        truth = ", ".join(miss["classes"]) or miss["label"]
        said = miss["verdict"] + (f" ({', '.join(miss['predicted_classes'])})" if miss["predicted_classes"] else "")
        lines.append(f"### {k + 1}. {miss['miss']}: `{miss['path']}`")
        lines.append(f"truth {truth}; the model said {said}; report {miss['report_id']}")
        thumb = frames / f"{k + 1:02d}.jpg"
        if image_root is not None and _thumbnail(image_root / miss["path"], thumb):
            lines.append(f"![{miss['path']}](misses/{thumb.name})")
        lines.append("")
    path = out / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def anomaly_lines(a: dict) -> list[str]:
    """The anomaly gate's own figures (the `anomaly` section of the result) as a Markdown section."""

    def rate(value, ci, k, n) -> str:
        return "n/a" if value is None else f"{value:.1%} ({k}/{n}; 95% CI {ci[0]:.1%}-{ci[1]:.1%})"

    alone = a["decided_by_gate_alone"]
    threshold = ", ".join(f"{t:.4g}" for t in a["thresholds"])  # several: the bank changed during the run
    lines = [
        "",
        "## Anomaly gate",
        "",
        f"bank {', '.join(a['bank_ids']) or 'none'}; policy {', '.join(a['policies'])}.",
        "",
        "| figure | value |",
        "|---|---|",
        f"| image AUROC | {'n/a' if a['image_auroc'] is None else format(a['image_auroc'], '.3f')} |",
        f"| escape (defects the gate passed) | {rate(a['escape'], a['escape_ci95'], a['escaped'], a['n_defect'])} |",
        f"| overkill (good parts it flagged) | "
        f"{rate(a['overkill'], a['overkill_ci95'], a['flagged_good'], a['n_good'])} |",
        f"| decided by the gate alone | {_pct(alone)} |",
        f"| threshold | {threshold or 'n/a'} |",
        f"| pixel AUROC | {_pixel(a)} |",
    ]
    if a["n_unscored"]:
        lines.append(f"| frames without a score | {a['n_unscored']} ({'; '.join(a['notes'])}) |")
    if a.get("roc_png"):
        lines += ["", f"![anomaly gate ROC]({a['roc_png']})"]
    return lines


def _pixel(a: dict) -> str:
    """The pixel AUROC cell: the figure (with what was left out), or why there is none."""
    note = a.get("pixel_auroc_note", "")
    if a.get("pixel_auroc") is None:
        return note or "n/a"
    return f"{a['pixel_auroc']:.3f}" + (f" ({note})" if note else "")
