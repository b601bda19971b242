"""The PLC handshake state machine, without I/O: edges, deadlines, the fail-safe mapping, write order."""

from __future__ import annotations

from edgeinspect.services.line.config import Meaning, StationLineConfig
from edgeinspect.services.line.handshake import (
    ErrorCode,
    Handshake,
    Late,
    Outcome,
    Phase,
    Signals,
    Start,
    line_signals,
    write_order,
)

CFG = StationLineConfig(result_deadline_ms=1000, ack_timeout_ms=2000)


def test_a_full_cycle_trigger_result_ack_returns_to_trigger_ready():
    hs = Handshake("s1", CFG)
    assert hs.signals.trigger_ready and not hs.signals.busy
    (start,) = hs.inputs(trigger=True, ack=False, now=0.0, cycle_id="cam:1")
    assert start == Start(1, "cam:1")
    assert hs.signals.busy and not hs.signals.trigger_ready and hs.signals.cycle_id == "cam:1"
    (written,) = hs.outcome(Outcome(1, verdict="DEFECT", defect_class="scratch", report_id="r1"), now=0.4)
    s = hs.signals
    assert (s.result_ready, s.result_ng, s.result_ok) == (True, True, False)
    assert (s.defect_class, s.report_id) == ("scratch", "r1")
    assert not s.busy and not s.trigger_ready and written.elapsed_s == 0.4
    assert hs.inputs(trigger=False, ack=True, now=0.5) == []
    assert hs.signals == Signals() and hs.phase is Phase.ready


def test_triggers_act_on_rising_edges_only_and_are_ignored_while_busy():
    hs = Handshake("s1", CFG)
    assert len(hs.inputs(True, False, 0.0)) == 1
    assert hs.inputs(True, False, 0.01) == []  # held high: no new edge
    assert hs.inputs(False, False, 0.02) == [] and hs.inputs(True, False, 0.03) == []  # an edge while busy
    assert hs.ignored_triggers == 1 and hs.cycle == 1


def test_a_missed_deadline_writes_ng_with_error_timeout_and_the_real_result_is_late():
    hs = Handshake("s1", CFG)
    hs.inputs(True, False, 0.0)
    assert hs.tick(0.999) == []
    (written,) = hs.tick(1.0)
    s = hs.signals
    assert (s.result_ready, s.result_ng, s.result_ok, s.error, s.busy) == (True, True, False, ErrorCode.timeout, False)
    assert written.outcome.error is ErrorCode.timeout
    late = Outcome(1, verdict="OK", report_id="r-late")
    assert hs.outcome(late, 1.5) == [Late(late)]
    assert not hs.signals.result_ok  # the late OK never turns the written NG into OK


def test_no_ack_times_out_into_error_and_the_next_trigger_recovers():
    hs = Handshake("s1", CFG)
    hs.inputs(True, False, 0.0)
    hs.outcome(Outcome(1, verdict="OK", report_id="r1"), 0.2)
    hs.inputs(False, False, 0.3)  # the PLC drops Trigger but never acks
    hs.tick(2.2)
    s = hs.signals
    assert (s.error, s.result_ready, s.busy, s.trigger_ready) == (ErrorCode.ack_timeout, False, False, True)
    assert len(hs.inputs(True, False, 3.0)) == 1 and hs.signals.error == 0 and hs.signals.busy


def test_an_unavailable_gateway_gives_ng_with_its_code_before_the_deadline():
    hs = Handshake("s1", CFG)
    hs.inputs(True, False, 0.0)
    hs.outcome(Outcome(1, error=ErrorCode.unavailable), 0.3)
    assert hs.signals.result_ng and hs.signals.error == ErrorCode.unavailable and hs.phase is Phase.result


def test_fail_safe_mapping_never_ok_without_a_clean_ok_verdict():
    ng = StationLineConfig()
    recheck = StationLineConfig(on_timeout=Meaning.recheck, on_uncertain=Meaning.recheck)
    assert line_signals("OK", ErrorCode.none, ng) == (True, False, False)
    assert line_signals("DEFECT", ErrorCode.none, recheck) == (False, True, False)
    assert line_signals("UNCERTAIN", ErrorCode.none, ng) == (False, True, False)
    assert line_signals("UNCERTAIN", ErrorCode.none, recheck) == (False, False, True)
    assert line_signals("", ErrorCode.timeout, recheck) == (False, False, True)
    assert line_signals("OK", ErrorCode.unavailable, recheck) == (False, True, False)  # errors other than timeout


def test_flags_that_drop_are_written_first_and_flags_that_rise_last():
    busy = Signals(trigger_ready=False, busy=True, cycle_id="c")
    done = Signals(trigger_ready=False, result_ready=True, result_ng=True, report_id="r", cycle_id="c")
    order = [name for name, _ in write_order(busy, done)]
    assert order[0] == "busy" and order[-1] == "result_ready" and set(order[1:-1]) == {"result_ng", "report_id"}
    order = [name for name, _ in write_order(done, Signals())]
    assert order[0] == "result_ready" and order[-1] == "trigger_ready"


def test_the_gates_finding_is_written_with_the_result_and_cleared_on_the_next_cycle():
    hs = Handshake("s", StationLineConfig())
    finding = {"score": 3.5, "ok_cut": 1.9, "threshold": 2.0, "decided_by": "GATE_AND_VLM",
               "regions": [[0.1, 0.2, 0.3, 0.4]]}  # fmt: skip
    hs.inputs(True, False, 0.0, "c1")
    hs.outcome(Outcome(1, verdict="DEFECT", report_id="r1", anomaly=finding), 0.1)
    s = hs.signals
    # AnomalyThreshold carries the OK cut (what decides OK), not the threshold inside the UNCERTAIN band.
    assert (s.anomaly_score, s.anomaly_threshold, s.decided_by) == (3.5, 1.9, "GATE_AND_VLM")
    assert s.region_count == 1 and s.regions == (0.1, 0.2, 0.3, 0.4)
    hs.inputs(False, True, 0.2)  # ack
    hs.inputs(True, False, 0.3, "c2")
    hs.outcome(Outcome(2, verdict="OK", report_id="r2"), 0.4)  # a station without a gate: no stale score
    s = hs.signals
    assert (s.anomaly_score, s.decided_by, s.region_count, s.regions) == (-1.0, "", 0, ())
