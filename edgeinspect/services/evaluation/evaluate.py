"""One evaluation: samples -> (resumed) inspections -> the result document written to the output folder."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path

from edgeinspect.services.client import InspectionClient
from edgeinspect.services.evaluation.anomaly import ROC_FILE, pixel_figure, roc_picture
from edgeinspect.services.evaluation.anomaly import figures as anomaly_figures
from edgeinspect.services.evaluation.datasets import Sample
from edgeinspect.services.evaluation.runner import EvalOptions, ResultLog, run_samples, sample_key
from edgeinspect.services.evaluation.scoring import measured, misses, score
from edgeinspect.v1 import inspection_pb2

RESULT_FILE = "result.json"
SCHEMA = "edgeinspect.eval/1"


def dataset_fingerprint(keyed: list[tuple[str, Sample]]) -> str:
    """One hash over every image's key (path + content hash) and label: same value, same labelled set."""
    h = hashlib.sha256()
    for key, s in sorted(keyed, key=lambda x: x[0]):
        h.update(f"{key}\t{s.label}\t{';'.join(s.classes)}\n".encode())
    return h.hexdigest()


def evaluate(
    samples: list[Sample],
    *,
    layout: str,
    dataset: Path,
    part: str,
    opts: EvalOptions,
    out: Path,
    settings: dict,
    on_start: Callable[[int, int], None] = lambda total, done: None,
    on_done: Callable[[dict], None] = lambda rec: None,
) -> dict:
    """Inspects what results.jsonl in `out` lacks, then scores every sample of this set; writes result.json."""
    log = ResultLog(out)
    keyed = [(sample_key(s, sha), s, sha) for s in samples for sha in [s.sha256()]]
    have = log.load()
    todo = [(s, sha) for key, s, sha in keyed if key not in have or have[key].get("error")]
    on_start(len(keyed), len(keyed) - len(todo))
    run_samples(todo, log, opts, on_done)
    have = log.load()
    records = sorted((have[key] for key, _, _ in keyed if key in have), key=lambda r: r["key"])
    result = {
        "schema": SCHEMA,
        "dataset": {
            "path": str(dataset),
            "layout": layout,
            "part": part,
            "images": len(keyed),
            "images_sha256": dataset_fingerprint([(k, s) for k, s, _ in keyed]),
        },
        "settings": settings,
        "measured": measured(records),
        "metrics": score(records),
        "misses": [
            {k: r[k] for k in ("path", "label", "classes", "verdict", "predicted_classes", "report_id", "miss")}
            for r in misses(records)
        ],
        "run": log.run,
    }
    gate = anomaly_figures(records)
    if gate is not None:  # only for a station whose reports carry the anomaly gate's finding
        by_key = {key: s for key, s, _ in keyed}
        with InspectionClient(opts.gateway, opts.token, timeout_s=opts.timeout_s, ca=opts.ca) as client:
            gate["pixel_auroc"], gate["pixel_auroc_note"] = pixel_figure(records, by_key, _heatmaps(client))
        roc = roc_picture(records, gate, out / ROC_FILE)
        result["anomaly"] = {**gate, "roc_png": roc.name if roc else None}
    (out / RESULT_FILE).write_text(dump(result))
    return result


def _heatmaps(client: InspectionClient):
    """report id -> its stored heatmap PNG through GetReportImage(heatmap=true), None where none is kept."""

    def fetch(report_id: str) -> bytes | None:
        request = inspection_pb2.GetReportImageRequest(report_id=report_id, heatmap=True)
        answer = client.call("GetReportImage", request)
        return answer.data if answer.state == inspection_pb2.IMAGE_STATE_STORED else None

    return fetch


def dump(result: dict) -> str:
    """The stable form: sorted keys, two-space indent, one trailing newline."""
    return json.dumps(result, sort_keys=True, indent=2) + "\n"
