"""The embedded stack's process lifecycle, with real processes: signals to `edgeinspect up`, roles that die with
their launcher (also when it is SIGKILLed), supervision restarting a killed role on its port, stage replicas."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import grpc
import pytest

from edgeinspect.assets import asset_path
from edgeinspect.services.client import InspectionClient
from edgeinspect.services.common.lifecycle import RestartPolicy, RoleProcess, signals_as_interrupt, supervise_step
from edgeinspect.services.gateway.settings import GatewaySettings
from edgeinspect.stack.launcher import LocalStack, StackOptions, free_ports, stage_name
from edgeinspect.v1 import stage_pb2, stage_pb2_grpc

START_S = 240  # a whole stack on a loaded 2-core box
GONE_S = 15.0  # the acceptance bound: no role left this long after `up` got its signal


def alive(pid: int) -> bool:
    """True while the process runs (a zombie waiting for a reaper that may never come counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def wait_gone(pids: list[int], timeout_s: float) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while (left := [p for p in pids if alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def start_up(tmp_path: Path, checkpoint: Path, *args: str) -> tuple[subprocess.Popen, dict]:
    """`edgeinspect up` as a background process of a script (SIGINT ignored, as a shell's `&` does)."""
    workdir = tmp_path / "up"
    port = free_ports(1, "127.0.0.1")[0]
    argv = [sys.executable, "-m", "edgeinspect.cli", "up", "--checkpoint", str(checkpoint), "--no-kb"]
    # The console on a free port too: every process `up` starts must follow it.
    argv += ["--port", str(port), "--workdir", str(workdir), "--console-port", "0", *args]
    log = (tmp_path / "up.log").open("wb")
    # A shell's `trap '' INT` then exec, as a script's `&` leaves it: SIGINT ignored across exec. Not a preexec_fn:
    # Python run between fork and exec in a process with gRPC threads (this one) can abort the child in gRPC's
    # fork handlers (seen in CI: "epoll_wait error: Bad file descriptor", rc -6).
    shell = "trap '' INT; exec \"$@\""
    proc = subprocess.Popen(["sh", "-c", shell, "sh", *argv], stdout=log, stderr=subprocess.STDOUT)
    stack_file = workdir / "run" / "stack.json"
    deadline = time.monotonic() + START_S
    while not stack_file.is_file():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"up did not come up (rc {proc.poll()}):\n{(tmp_path / 'up.log').read_text()[-3000:]}")
        time.sleep(0.2)
    return proc, json.loads(stack_file.read_text())


def kill_all(proc: subprocess.Popen, pids: list[int]) -> None:
    """Cleanup whatever a failed assertion left running, by pid."""
    for pid in [proc.pid, *pids]:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)
    proc.wait()


def stats(address: str) -> stage_pb2.StatsResponse:
    with grpc.insecure_channel(address) as channel:
        return stage_pb2_grpc.DecoderStageStub(channel).Stats(stage_pb2.StatsRequest(), timeout=10)


def test_sigterm_to_up_stops_every_role_of_a_replicated_stack(tmp_path, tiny_checkpoint):
    proc, stack = start_up(tmp_path, tiny_checkpoint, "--stages", "2", "--replicas", "2")
    pids = [r["pid"] for r in stack["roles"]]
    try:
        stages = [r for r in stack["roles"] if r["role"] == "stage"]
        assert sorted(r["name"] for r in stages) == ["stage0", "stage0r1", "stage1", "stage1r1"]
        assert len({r["address"] for r in stages}) == 4  # each replica its own fixed port
        for r in stages:  # each endpoint serves the range stack.json names
            identity = stats(r["address"]).identity
            assert [identity.layer_start, identity.layer_end] == r["layers"]
        assert sorted({tuple(r["layers"]) for r in stages}) == [(0, 3), (3, 5)]
        gateway_cfg = GatewaySettings.load(tmp_path / "up" / "run" / "gateway.yaml")
        assert sorted(gateway_cfg.stages) == sorted(r["address"] for r in stages)
        assert all(alive(p) for p in pids)

        os.kill(proc.pid, signal.SIGTERM)
        assert wait_gone(pids, GONE_S) == [], "roles still running after SIGTERM to up"
        assert proc.wait(30) == 0  # its own exit (interpreter teardown after torch) is slow on a loaded box
        assert not (tmp_path / "up" / "run" / "stack.json").exists()
    finally:
        kill_all(proc, pids)


def test_sigkill_of_up_takes_every_role_with_it(tmp_path, tiny_checkpoint):
    proc, stack = start_up(tmp_path, tiny_checkpoint, "--stages", "2")
    pids = [r["pid"] for r in stack["roles"]]
    try:
        assert {"vision", "stage0", "stage1", "gateway"} <= {r["name"] for r in stack["roles"]}
        assert all(alive(p) for p in pids)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        assert wait_gone(pids, GONE_S) == [], "roles outlived a SIGKILLed up"
    finally:
        kill_all(proc, pids)


def test_a_supervised_stage_killed_comes_back_on_its_port_and_the_stack_inspects_again(
    tmp_path, tiny_checkpoint, caplog
):
    caplog.set_level("WARNING")
    fast = RestartPolicy(base_s=0.2, max_s=1.0)
    # One stage keeps it cheap (the replicated, multi-stage failover is the gateway's chaos test).
    opts = StackOptions(workdir=tmp_path, checkpoint=tiny_checkpoint, stages=1, supervise=True, restart_policy=fast)
    image = asset_path("part_dent.jpg").read_bytes()
    with LocalStack(opts) as stack:
        before = stack.role("stage0")
        port, pid = before.port, before.pid
        os.kill(pid, signal.SIGKILL)  # a crash the stack did not ask for
        role = stack.wait_restarted("stage0", pid)
        assert role.port == port and role.pid != pid and role.restarts == 1
        listed = {r["name"]: r for r in json.loads(stack.stack_file.read_text())["roles"]}
        assert listed["stage0"]["pid"] == role.pid and listed["stage0"]["address"] == f"127.0.0.1:{port}"
        said = [r.getMessage() for r in caplog.records]
        assert any(m.startswith("stage0 exited with code -9; restarting in 0.2 s (attempt 2)") for m in said), said
        report = _inspect_until_it_works(stack, image, within_s=30.0)
        assert report.report_id and len(report.generated_token_ids) > 0


def _inspect_until_it_works(stack, image: bytes, within_s: float):
    """The gateway's routing readmits the restarted stage after its next handshake; until then it may refuse."""
    deadline = time.monotonic() + within_s
    with InspectionClient(stack.gateway_address, stack.api_token, ca=stack.client_ca) as client:
        while True:
            try:
                return client.inspect(image, max_new_tokens=4)
            except grpc.RpcError as exc:
                if exc.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                    raise
                time.sleep(0.5)


def test_restart_policy_backs_off_then_gives_up_and_a_stable_run_resets_the_count():
    policy = RestartPolicy(base_s=0.4, factor=2.0, max_s=1.0, max_restarts=3, stable_s=30.0)
    assert [policy.delay(n) for n in (1, 2, 3, 4)] == [0.4, 0.8, 1.0, None]
    assert policy.next_count(2, ran_s=1.0) == 3  # crashed soon after its start: one more in a row
    assert policy.next_count(3, ran_s=45.0) == 1  # ran a while first: a fresh count


def test_stage_names_address_replicas_without_parsing():
    assert [stage_name(k, r) for k in range(2) for r in range(2)] == ["stage0", "stage0r1", "stage1", "stage1r1"]
    assert len(set(free_ports(8, "127.0.0.1"))) == 8


def test_sighup_and_sigterm_raise_like_ctrl_c_and_the_old_handlers_come_back():
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGHUP, signal.SIGTERM)}
    for sig in before:
        started = time.monotonic()
        with pytest.raises(KeyboardInterrupt), signals_as_interrupt():
            os.kill(os.getpid(), sig)
            time.sleep(5)  # the handler raises in this (the main) thread long before the sleep ends
        assert time.monotonic() - started < 4
    assert {sig: signal.getsignal(sig) for sig in before} == before


# A launcher (python) starting one "role" that arms only the parent-pid watch (no prctl), then SIGKILLed: the role
# must notice and stop. This proves the fallback that covers systems without PR_SET_PDEATHSIG.
WATCHED_ROLE = textwrap.dedent(
    """
    import os, sys, time
    from edgeinspect.services.common.lifecycle import watch_parent
    watch_parent(int(os.environ["EDGEINSPECT_PARENT_PID"]), interval_s=0.1)
    print(os.getpid(), flush=True)
    time.sleep(120)
    """
)
LAUNCHER = textwrap.dedent(
    """
    import os, subprocess, sys, time
    env = {**os.environ, "EDGEINSPECT_PARENT_PID": str(os.getpid())}
    child = subprocess.Popen([sys.executable, "-c", sys.argv[1]], env=env, stdout=subprocess.PIPE, text=True)
    print(child.stdout.readline().strip(), flush=True)
    time.sleep(120)
    """
)


def test_the_parent_watch_alone_ends_a_role_whose_launcher_was_sigkilled():
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER, WATCHED_ROLE], stdout=subprocess.PIPE, text=True)
    role_pid = int(launcher.stdout.readline())
    try:
        assert alive(role_pid)
        launcher.kill()
        launcher.wait()
        assert wait_gone([role_pid], 5.0) == []
    finally:
        if alive(role_pid):
            os.kill(role_pid, signal.SIGKILL)


# A launcher forking a "role" from a thread that ends before the role arms PR_SET_PDEATHSIG (a stack stopped while
# the role still imports): the signal would never come, and the launcher lives on, so the role must not start.
LATE_ROLE = textwrap.dedent(
    """
    import time
    time.sleep(0.5)  # the role's imports: the thread that forked it ends meanwhile
    from edgeinspect.services.common.lifecycle import die_with_launcher
    die_with_launcher()
    print("serving", flush=True)
    time.sleep(120)
    """
)
THREAD_LAUNCHER = textwrap.dedent(
    """
    import os, subprocess, sys, threading
    env, forked = {**os.environ, "EDGEINSPECT_PARENT_PID": str(os.getpid())}, []
    def fork():
        env["EDGEINSPECT_PARENT_TID"] = str(threading.get_native_id())
        forked.append(subprocess.Popen([sys.executable, "-c", sys.argv[1]], env=env, stdout=subprocess.PIPE, text=True))
    thread = threading.Thread(target=fork)
    thread.start()
    thread.join()
    print(forked[0].pid, flush=True)
    print(forked[0].wait(60), forked[0].stdout.read().strip() or "-", flush=True)
    """
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_role_whose_forking_thread_ended_before_it_armed_does_not_start():
    launcher = subprocess.Popen([sys.executable, "-c", THREAD_LAUNCHER, LATE_ROLE], stdout=subprocess.PIPE, text=True)
    role_pid = int(launcher.stdout.readline())
    try:
        code, said = launcher.stdout.readline().split(maxsplit=1)
        assert (int(code), said.strip()) == (1, "-")  # exited before serving, its launcher still alive
        assert launcher.wait(30) == 0
    finally:
        for pid in (role_pid, launcher.pid):
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_up_with_a_kb_folder_that_holds_no_index_says_so_before_starting_anything(tmp_path):
    empty = tmp_path / "kb"
    empty.mkdir()
    argv = [sys.executable, "-m", "edgeinspect.cli", "up", "--kb", str(empty), "--workdir", str(tmp_path / "w")]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "400"})
    assert out.returncode != 0
    assert "holds no index" in out.stderr and "edgeinspect kb index" in out.stderr
    assert not (tmp_path / "w" / "run").exists()  # no role was started


def test_a_role_that_keeps_crashing_is_given_up_on_after_the_bound_and_says_why(tmp_path, caplog):
    caplog.set_level("WARNING")
    log_path = tmp_path / "crashy.log"
    crash = [sys.executable, "-c", "import sys; print('bad config: no such checkpoint'); sys.exit(3)"]

    def launch() -> subprocess.Popen:
        with log_path.open("ab") as f:
            return subprocess.Popen(crash, stdout=f, stderr=subprocess.STDOUT)

    def relaunch(role: RoleProcess) -> None:
        role.proc, role.started_at = launch(), time.monotonic()

    role = RoleProcess("stage1", launch(), 50123, log_path, "stage")
    policy = RestartPolicy(base_s=0.1, max_s=0.4, max_restarts=3)
    deadline = time.monotonic() + 60
    while not role.given_up and time.monotonic() < deadline:
        supervise_step(role, policy, relaunch)
        time.sleep(0.01)
    assert role.given_up and role.crashes_in_a_row == 4 and role.proc.poll() == 3
    said = [r.getMessage() for r in caplog.records]
    assert [m.split(";")[1].strip() for m in said if "; restarting in" in m] == [
        "restarting in 0.1 s (attempt 2)",
        "restarting in 0.2 s (attempt 3)",
        "restarting in 0.4 s (attempt 4)",
    ]
    assert "stage1 exited with code 3 after 4 crashes in a row; not restarting it again" in said[-1]
    assert "bad config: no such checkpoint" in said[-1]  # the log's tail, so the cause is on the screen


def test_a_second_up_on_a_running_stack_is_refused_at_once_and_the_first_keeps_serving(tmp_path, tiny_checkpoint):
    proc, stack = start_up(tmp_path, tiny_checkpoint, "--stages", "1", "--allow-unauthenticated")
    pids = [r["pid"] for r in stack["roles"]]
    run = tmp_path / "up" / "run"
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    try:
        again = [sys.executable, "-m", "edgeinspect.cli", "up", "--checkpoint", str(tiny_checkpoint), "--no-kb"]
        other_port = str(free_ports(1, "127.0.0.1")[0])
        second = subprocess.run(
            [*again, "--workdir", str(tmp_path / "up"), "--port", other_port, "--console-port", "-1"],
            capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "200"},
        )  # fmt: skip
        said = (second.stdout + second.stderr).strip()
        assert second.returncode != 0 and "already running" in said and f"launcher pid {proc.pid}" in said, said
        assert stack["gateway"] in said and len(said.splitlines()) <= 3, said
        assert {p.name: p.read_bytes() for p in run.iterdir()} == before  # nothing rewritten, nothing deleted
        # The first stack's gateway port from another workdir: refused before anything is written there.
        gateway_port = stack["gateway"].rsplit(":", 1)[1]
        third = subprocess.run(
            [*again, "--workdir", str(tmp_path / "other"), "--port", gateway_port, "--console-port", "-1"],
            capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "200"},
        )  # fmt: skip
        said = (third.stdout + third.stderr).strip()
        assert third.returncode != 0 and f"port {gateway_port}" in said and "in use" in said, said
        assert not (tmp_path / "other" / "run").exists()

        gateway = next(r for r in stack["roles"] if r["name"] == "gateway")
        os.kill(gateway["pid"], signal.SIGKILL)  # the first stack's supervisor brings it back with its own configs
        deadline = time.monotonic() + 90
        image = asset_path("part_dent.jpg").read_bytes()
        with InspectionClient(stack["gateway"], "") as client:
            while True:
                try:
                    report = client.inspect(image, max_new_tokens=4)
                    break
                except grpc.RpcError as exc:
                    if exc.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                        raise
                    time.sleep(0.5)
        assert report.report_id and len(report.generated_token_ids) > 0
        roles = {r["name"]: r for r in json.loads((run / "stack.json").read_text())["roles"]}
        assert roles["gateway"]["pid"] != gateway["pid"] and roles["gateway"]["address"] == gateway["address"]
        pids += [r["pid"] for r in roles.values()]
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        wait_gone(pids, GONE_S)
        kill_all(proc, pids)
