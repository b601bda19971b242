"""Teaching the anomaly gate from the gateway's own stored frames (admin RPCs AddToGoodSet, TeachFromReports,
PromoteBank).

The vision node owns the banks and publishes every new version atomically (services/vision/banks.py); the gateway
only picks the frames: a falsely rejected report's frame added to the part's current good set, or the frames of the
last N reports a person reviewed OK, taught afresh. With stage the new version is held back (the go-live gate runs
on it first) until PromoteBank makes it current.
"""

from __future__ import annotations

import asyncio
import logging

import grpc

from edgeinspect.errors import EdgeInspectError, FailedPrecondition, InvalidInput, NotFound, Unavailable
from edgeinspect.services.gateway.inspection import Inspector
from edgeinspect.services.gateway.reports.reader import ReportReader
from edgeinspect.v1 import inspection_pb2, vision_pb2

log = logging.getLogger(__name__)

TEACH_TIMEOUT_S = 600.0  # features for every frame of the set: minutes on a small box for a few hundred
PROMOTE_TIMEOUT_S = 60.0  # reads the version and builds its index; waits for a teach in progress on the node
SCAN_FACTOR = 10  # TeachFromReports reads at most this many reviewed reports per frame it wants
_TYPED = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidInput,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
}


async def add_to_good_set(
    store: ReportReader, inspector: Inspector, report_id: str, stage: bool = False
) -> inspection_pb2.AnomalyBankVersion:
    """The report's stored frame joins its part's good set: the vision node teaches the next bank version from the
    current one's frames plus this one (stage: from the staged one's where there is one, and holds it back)."""
    report = await asyncio.to_thread(store.get, report_id)
    if not report.part:
        raise FailedPrecondition(f"report {report_id[:12]} names no part: there is no bank to add its frame to")
    frame = await _frame(store, report)
    if frame is None:
        raise FailedPrecondition(
            f"report {report_id[:12]}'s frame is not in the frame store (not kept, or pruned by retention): "
            "nothing to add to the good set"
        )
    request = vision_pb2.TeachRequest(part=report.part, frames=[frame], add_to_current=True, stage=stage)
    version = await _teach(inspector, request, f"adding report {report_id[:12]}'s frame to part {report.part}")
    log.info("report %s added to part %s's good set: %s%s", report_id, report.part, version.bank_id,
             " (staged)" if version.staged else "")  # fmt: skip
    return version


async def teach_from_reports(
    store: ReportReader, inspector: Inspector, station: str, part: str, last_n: int, stage: bool = False
) -> inspection_pb2.AnomalyBankVersion:
    """Teaches `part` afresh from the frames of the station's last `last_n` reports of it that a person reviewed OK."""
    frames: list[bytes] = []
    token, scanned = "", 0
    while len(frames) < last_n and scanned < SCAN_FACTOR * last_n:
        reports, token = await asyncio.to_thread(
            store.list, station=station, part=part, review=inspection_pb2.REVIEW_FILTER_REVIEWED, page_token=token
        )
        for report in reports:
            scanned += 1
            if report.review.verdict != inspection_pb2.VERDICT_OK:
                continue
            frame = await _frame(store, report)
            if frame is not None:
                frames.append(frame)
                if len(frames) == last_n:
                    break
        if not token:
            break
    if len(frames) < 2:
        raise FailedPrecondition(
            f"station {station!r}, part {part!r}: {len(frames)} report(s) reviewed OK with their frame still kept "
            f"(of {scanned} reviewed read); a bank needs at least 2: review more good parts first"
        )
    request = vision_pb2.TeachRequest(part=part, frames=frames, stage=stage)
    version = await _teach(inspector, request, f"teaching part {part} from {len(frames)} reviewed frames")
    log.info("part %s taught from %d reports of station %s: %s", part, len(frames), station, version.bank_id)
    return version


async def promote_bank(inspector: Inspector, part: str, version: int, force: bool) -> inspection_pb2.AnomalyBankVersion:
    """The part's staged bank version becomes current on the vision node (its go-live figures checked unless
    forced); Score expects it from now on."""
    request = vision_pb2.PromoteRequest(part=part, version=version, force=force)
    try:
        bank = await inspector.vision.promote(request, PROMOTE_TIMEOUT_S)
    except grpc.aio.AioRpcError as exc:
        raise _typed(exc, f"promoting part {part}'s bank v{version}") from None
    inspector.gate.learned(bank.part, bank.bank_id)
    log.info("part %s: staged bank %s promoted to current%s", part, bank.bank_id, " (forced)" if force else "")
    return _version(bank, [])


async def _frame(store: ReportReader, report: inspection_pb2.DefectReport) -> bytes | None:
    answer = await asyncio.to_thread(store.image, report.report_id)
    return answer.data if answer.state == inspection_pb2.IMAGE_STATE_STORED else None


async def _teach(
    inspector: Inspector, request: vision_pb2.TeachRequest, what: str
) -> inspection_pb2.AnomalyBankVersion:
    try:
        reply = await inspector.vision.teach(request, TEACH_TIMEOUT_S)
    except grpc.aio.AioRpcError as exc:
        raise _typed(exc, what) from None
    bank = reply.bank
    if not bank.staged:
        inspector.gate.learned(bank.part, bank.bank_id)  # the next Score expects the new version
    return _version(bank, list(reply.outliers))


def _version(bank: vision_pb2.AnomalyBank, outliers: list[str]) -> inspection_pb2.AnomalyBankVersion:
    return inspection_pb2.AnomalyBankVersion(
        part=bank.part,
        bank_id=bank.bank_id,
        version=bank.version,
        threshold=bank.threshold,
        frames=bank.frames,
        outliers=outliers,
        staged=bank.staged,
    )


def _typed(exc: grpc.aio.AioRpcError, what: str) -> EdgeInspectError:
    """The vision node's refusal as our own error, its reason kept (a teach refused changes no bank)."""
    details = exc.details() or exc.code().name
    kind = _TYPED.get(exc.code())
    if kind is not None:
        return kind(f"{what}: the vision node refused: {details}")
    return Unavailable(f"{what}: the vision node did not answer ({exc.code().name}); the bank is unchanged, retry")
