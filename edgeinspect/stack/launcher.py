"""The embedded default: every role on one box, each its own OS process, wired over loopback gRPC.

Used by `edgeinspect up`/`demo` and by the end-to-end tests, so what the tests prove is what a user runs.
Every role gets a fixed port picked before anything starts, written into its run config (run/NAME.yaml, 0600),
so a role restarted from its config (by the supervisor, a test or a person) comes back where its peers look.
With `supervise`, a crashed role is restarted on its port with backoff instead of the stack stopping.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from edgeinspect.config import RoleSettings, ServerConfig
from edgeinspect.errors import InvalidInput, Unavailable
from edgeinspect.services.common.lifecycle import (
    PARENT_PID_ENV,
    PARENT_TID_ENV,
    RoleProcess,
    supervise_step,
    terminate,
)
from edgeinspect.services.console.settings import ConsoleSettings
from edgeinspect.services.gateway.settings import GatewaySettings
from edgeinspect.services.retrieval.settings import RetrievalSettings
from edgeinspect.services.stage.settings import StageSettings
from edgeinspect.services.store.settings import StoreBackend, StoreSettings
from edgeinspect.services.vision.settings import AnomalySettings, VisionSettings
from edgeinspect.stack.roles import (
    ROLES,
    STACK_FILE,
    StackOptions,
    ensure_tiny_checkpoint,
    free_ports,
    gate_policy,
    replica_name,
    stage_name,
    stage_ranges,
    write_private_yaml,
)
from edgeinspect.stack.security import StackCredentials, stack_credentials
from edgeinspect.stack.workdir_lock import WorkdirLock, check_port_free

__all__ = ["LocalStack", "RoleProcess", "StackOptions", "free_ports", "stage_name", "stage_ranges"]

log = logging.getLogger(__name__)


class LocalStack:
    """Starts the roles (vision, stages x replicas, retrieval, gateway) as processes; `stop` ends them all.

    Every role is forked from one thread (`_spawner`) that lives exactly as long as the stack: the roles arm
    PR_SET_PDEATHSIG, which fires when the forking *thread* exits, so forking from the caller's thread (which a
    test or a thread pool may end early) or from the supervisor would tie a role's life to the wrong thread.
    """

    def __init__(self, opts: StackOptions):
        self.opts = opts
        self.roles: list[RoleProcess] = []
        self.run_dir = opts.workdir / "run"
        self.banks_dir = opts.banks_dir or opts.workdir / "banks"
        self.gateway_address = ""  # the first gateway (tests and tools that talk to one)
        self.gateway_addresses: list[str] = []  # every gateway: what a client of a pair holds
        self.checkpoint: Path | None = None
        self.creds: StackCredentials | None = None  # the token and TLS files, known once start() ran
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)  # notified on every (re)start and give-up
        self._stopping = threading.Event()
        self._spawner: ThreadPoolExecutor | None = None
        self._spawner_tid = 0  # its native thread id, passed to the roles (lifecycle.die_with_launcher)
        self._supervisor: threading.Thread | None = None
        self._killed: dict[str, int] = {}  # name -> the pid kill() ended last (wait_restarted's default)
        self.metrics_ports: dict[str, int] = {}  # name -> its /metrics port (kept across restarts)
        self._ports: Iterator[int] = iter(())
        self._workdir_lock = WorkdirLock(opts.workdir)

    def __enter__(self) -> LocalStack:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def api_token(self) -> str:
        return self.creds.token if self.creds is not None else self.opts.api_token

    @property
    def console_url(self) -> str | None:
        """The web console's address, when this stack runs one."""
        return next((f"http://{self.opts.host}:{r.port}" for r in self.roles if r.name == "console"), None)

    @property
    def client_ca(self) -> Path | None:
        """The CA a client of the public API verifies the gateway with (None: plaintext)."""
        return self.creds.ca if self.creds is not None else None

    @property
    def stack_file(self) -> Path:
        return self.run_dir / STACK_FILE

    def role(self, name: str) -> RoleProcess:
        for r in self.roles:
            if r.name == name:
                return r
        raise KeyError(f"no role {name!r} in this stack (roles: {', '.join(r.name for r in self.roles)})")

    def address_of(self, name: str) -> str:
        return f"{self.opts.host}:{self.role(name).port}"

    def stage_endpoints(self, k: int) -> list[str]:
        """host:port of every replica serving layer range k, replica 0 first."""
        ranges = self.layer_ranges
        if not 0 <= k < len(ranges):
            raise KeyError(f"no layer range {k}: this stack has {len(ranges)}")
        stages = sorted((r for r in self.roles if r.role == "stage" and r.layers == ranges[k]), key=lambda r: r.replica)
        return [f"{self.opts.host}:{r.port}" for r in stages]

    @property
    def layer_ranges(self) -> list[tuple[int, int]]:
        return sorted({r.layers for r in self.roles if r.role == "stage" and r.layers is not None})

    def start(self) -> None:
        o = self.opts
        if o.gateways > 1 and not o.store_dsn:
            raise InvalidInput(
                f"{o.gateways} gateways need a shared PostgreSQL report store (--store-dsn): SQLite is one gateway's"
            )
        if min(o.stages, o.replicas, o.vision_replicas, o.retrieval_replicas, o.gateways) < 1:
            raise InvalidInput(
                f"stages and replicas must be >= 1, got {o.stages}, {o.replicas}, {o.vision_replicas} (vision) and "
                f"{o.retrieval_replicas} (retrieval)"
            )
        # Before anything is written or started: one stack per workdir, and the gateway's port not taken.
        self._workdir_lock.acquire()
        check_port_free(o.host, o.gateway_port, "the gateway")
        self.run_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.run_dir, 0o700)
        self.creds = stack_credentials(o.workdir, o.tls, o.host, o.api_token)
        self._stopping.clear()
        self._spawner = ThreadPoolExecutor(1, thread_name_prefix="edgeinspect-roles")
        self._spawner_tid = self._spawner.submit(threading.get_native_id).result()
        self.checkpoint = ckpt = o.checkpoint or ensure_tiny_checkpoint(o.workdir)
        from edgeinspect.models.checkpoint import open_checkpoint

        ranges = stage_ranges(open_checkpoint(ckpt).num_layers, o.stages)
        visions = [replica_name("vision", r) for r in range(o.vision_replicas)]
        retrievals = [replica_name("retrieval", r) for r in range(o.retrieval_replicas)] if o.kb_dir else []
        upstreams = len(visions) + len(ranges) * o.replicas + len(retrievals)
        metrics = (upstreams + 1) if o.metrics else 0  # one more port per role, the gateway's included
        metrics += o.gateways - 1 if o.metrics else 0
        gateway_ports = (o.gateway_port == 0) + o.gateways - 1
        ports = iter(free_ports(upstreams + gateway_ports + metrics, o.host, avoid=(o.gateway_port,)))
        self._ports = ports
        addr = {}  # name -> port, known before anything starts: the gateway needs them

        def place(name: str) -> ServerConfig:
            addr[name] = next(ports)
            return self._server(name, addr[name])

        for r, name in enumerate(visions):  # replicas share the banks folder: a teach reaches them all
            vision = VisionSettings(
                checkpoint=ckpt,
                backend=o.vision_backend,
                server=place(name),
                onnx_path=o.workdir / "vision.onnx",
                anomaly=AnomalySettings(banks_dir=self.banks_dir),
            )
            self._spawn(name, "vision", vision, replica=r)
        names = [[stage_name(k, r) for r in range(o.replicas)] for k in range(len(ranges))]
        servers = {n: place(n) for row in names for n in row}
        for k, (a, b) in enumerate(ranges):
            for r, name in enumerate(names[k]):
                cfg = StageSettings(
                    checkpoint=ckpt, layer_start=a, layer_end=b, weights=o.weights, server=servers[name]
                )
                self._spawn(name, "stage", cfg, layers=(a, b), replica=r)
        for r, name in enumerate(retrievals):
            self._spawn(name, "retrieval", RetrievalSettings(kb_dir=o.kb_dir, server=place(name)), replica=r)
        gateway = GatewaySettings(
            checkpoint=ckpt,
            vision=[f"{o.host}:{addr[n]}" for n in visions],
            stages=[f"{o.host}:{addr[n]}" for row in names for n in row],  # every endpoint; range-major order
            retrieval=[f"{o.host}:{addr[n]}" for n in retrievals],
            codec=o.codec,
            db_path=o.workdir / "reports.sqlite",
            api_tokens=[] if o.allow_unauthenticated else self.creds.api_tokens(),
            allow_unauthenticated=o.allow_unauthenticated,
            client_tls=self.creds.client_tls("gateway"),
            server=self._server("gateway", o.gateway_port or next(ports)),
            upstream_timeout_s=o.start_timeout_s,
            anomaly=gate_policy(o.anomaly, o.gate_stations),
        )
        gateway_names = [replica_name("gateway", g) for g in range(o.gateways)]
        gateway_at = []  # host:port of each gateway: what the console (a client of the public API) holds
        for g, name in enumerate(gateway_names):
            cfg = gateway
            if o.store_dsn:  # a pair: one database, a name per gateway, frames per gateway (each box its own)
                store = StoreSettings(backend=StoreBackend.postgres, dsn=o.store_dsn, instance=name,
                                      owner_lease_s=o.owner_lease_s)  # fmt: skip
                server = gateway.server if g == 0 else self._server(name, next(ports))
                cfg = gateway.model_copy(update={"store": store, "server": server,
                                                 "db_path": o.workdir / name / "reports.sqlite"})  # fmt: skip
            self._spawn(name, "gateway", cfg)
            gateway_at.append(f"{o.host}:{cfg.server.port}")
        if o.console_port is not None:  # a client of the public API (TLS: it verifies the gateway with the CA)
            taken = (*(r.port for r in self.roles), *self.metrics_ports.values())
            port = o.console_port or free_ports(1, o.host, avoid=taken)[0]
            server = ServerConfig(host=o.host, port=port, port_file=self.run_dir / "console.port", grace_s=2.0)
            console = ConsoleSettings(gateway=",".join(gateway_at), server=server, client_tls=self.creds.public_tls())
            self._spawn("console", "console", console)
        self.gateway_addresses = [self.address_of(n) for n in gateway_names]
        self.gateway_address = self.gateway_addresses[0]
        for role in self.roles:
            self._wait_bound(role)
        for address in self.gateway_addresses:
            self._wait_serving(address)
        # The gateway serves once one complete route exists; with replicas another may still be loading its
        # weights. `up` reports a stack whose every stage serves (seen: stage0r1 still loading when stack.json
        # appeared, its Stats answered UNAVAILABLE).
        for role in self.roles:
            if role.role in ("stage", "vision"):
                self._wait_serving(self.address_of(role.name), role)
        self._write_stack_file()
        self._workdir_lock.note(gateway=",".join(self.gateway_addresses))
        if o.supervise:
            self._supervisor = threading.Thread(target=self._supervise, name="edgeinspect-supervisor", daemon=True)
            self._supervisor.start()

    def metrics_url(self, name: str) -> str | None:
        """http://host:port/metrics of the role (None: metrics off)."""
        port = self.metrics_ports.get(name)
        return f"http://{self.opts.host}:{port}/metrics" if port else None

    def _server(self, name: str, port: int) -> ServerConfig:
        if self.opts.metrics and name not in self.metrics_ports:
            self.metrics_ports[name] = next(self._ports)
        return ServerConfig(
            host=self.opts.host,
            port=port,
            metrics_port=self.metrics_ports.get(name),
            port_file=self.run_dir / f"{name}.port",
            grace_s=2.0,
            tls=self.creds.server_tls(name) if self.creds is not None else None,
        )

    def _spawn(self, name: str, role: str, cfg: RoleSettings, **kw) -> RoleProcess:
        config_path = self.run_dir / f"{name}.yaml"
        write_private_yaml(cfg, config_path)
        log_path = self.opts.workdir / "logs" / f"{name}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        proc = self._popen(role, config_path, log_path)
        rp = RoleProcess(name, proc, cfg.server.port, log_path, role, config_path, **kw)
        with self._lock:
            self.roles.append(rp)
        return rp

    def _popen(self, role: str, config_path: Path, log_path: Path) -> subprocess.Popen:
        """Starts `python -m ROLE --config FILE` from the spawner thread (see the class comment)."""
        (self.run_dir / f"{config_path.stem}.port").unlink(missing_ok=True)
        env = {
            **os.environ,
            "HF_HUB_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "TQDM_DISABLE": "1",  # no progress bars ("Batches: 100%") in a role's JSON log; tqdm reads it at import
            # the role writes its log itself, rotated at log_max_mb (stdout/stderr still append there: a crash)
            "EDGEINSPECT_LOG_FILE": str(log_path),
            **self.opts.extra_env,
            PARENT_PID_ENV: str(os.getpid()),
            PARENT_TID_ENV: str(self._spawner_tid),
        }
        with log_path.open("ab") as logf:
            argv = [sys.executable, "-m", ROLES[role].module, "--config", str(config_path)]
            # A session of its own: a Ctrl-C in the terminal reaches `up`, which stops the roles in order.
            if self._spawner is None:
                raise Unavailable("the stack is stopped")
            return self._spawner.submit(
                subprocess.Popen, argv, stdout=logf, stderr=subprocess.STDOUT, env=env, start_new_session=True
            ).result()

    def _relaunch(self, role: RoleProcess) -> None:
        """Starts the role again from its run config (the same port: the config carries it)."""
        if role.config_path is None:
            raise Unavailable(f"{role.name} has no run config to start again from")
        role.proc = self._popen(role.role, role.config_path, role.log_path)
        role.started_at = time.monotonic()
        role.restarts += 1
        self._changed.notify_all()

    def _wait_bound(self, role: RoleProcess) -> None:
        """Until the role has bound its port (its port file appears), or it exits."""
        port_file = self.run_dir / f"{role.name}.port"
        deadline = time.monotonic() + self.opts.start_timeout_s
        while time.monotonic() < deadline:
            if role.proc.poll() is not None:
                raise Unavailable(
                    f"{role.name} exited with code {role.proc.returncode}; see {role.log_path}:\n" + role.log_tail()
                )
            if port_file.is_file() and port_file.read_text().strip():
                bound = int(port_file.read_text())
                if bound != role.port:
                    raise Unavailable(f"{role.name} bound port {bound}, not its configured {role.port}")
                return
            time.sleep(0.05)
        raise Unavailable(f"{role.name} did not bind a port within {self.opts.start_timeout_s}s; see {role.log_path}")

    def _wait_serving(self, address: str, role: RoleProcess | None = None) -> None:
        """Until the server at address says SERVING. Raises when a role exits meanwhile (during start, any role;
        when waiting for one supervised role, only a give-up: the supervisor restarts it otherwise)."""
        import grpc
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        if self.creds is None:
            raise Unavailable("the stack is not started")
        deadline = time.monotonic() + self.opts.start_timeout_s
        with self.creds.probe_channel(address) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            while time.monotonic() < deadline:
                for r in [role] if role is not None else self.roles:
                    if r.given_up or (not self._supervising() and r.proc.poll() is not None):
                        raise Unavailable(f"{r.name} exited with code {r.proc.returncode}:\n" + r.log_tail())
                try:
                    check = stub.Check  # pyright: ignore[reportAttributeAccessIssue]  # typeshed's stub omits Check
                    if check(health_pb2.HealthCheckRequest(), timeout=2).status == 1:
                        return
                except grpc.RpcError:
                    pass
                time.sleep(0.2)
        raise Unavailable(f"{address} was not SERVING within {self.opts.start_timeout_s}s")

    def _supervising(self) -> bool:
        return self._supervisor is not None and self._supervisor.is_alive()

    def kill(self, name: str) -> int:
        """SIGKILL one role (failure tests); returns the pid it had. Supervised, it comes back by itself:
        `wait_restarted(name)` waits for that."""
        role = self.role(name)
        pid = self._killed[name] = role.pid
        role.proc.kill()
        role.proc.wait()
        return pid

    def restart(self, name: str) -> None:
        """Stops the role if it runs and starts it again from its run config (same port), then waits until it
        is bound (the gateway: SERVING)."""
        role = self.role(name)
        with self._lock:
            role.held = True
            role.restart_at = None
        try:
            terminate([role], timeout_s=10.0)
            with self._lock:
                self._relaunch(role)
                role.given_up, role.crashes_in_a_row = False, 0
            self._wait_bound(role)
            if role.role == "gateway":
                self._wait_serving(self.address_of(name))
        finally:
            with self._lock:
                role.held = False
            self._write_stack_file()

    def wait_restarted(self, name: str, old_pid: int | None = None, timeout_s: float | None = None) -> RoleProcess:
        """Until the supervisor has started `name` again (a pid other than old_pid: by default the one kill()
        ended, else the current one) and it is SERVING."""
        if old_pid is None:
            old_pid = self._killed.get(name) or self.role(name).pid
        deadline = time.monotonic() + (timeout_s or self.opts.start_timeout_s)
        with self._changed:
            while True:
                role = self.role(name)
                if role.given_up:
                    raise Unavailable(f"{name} crashed too often in a row; the supervisor gave up on it")
                if role.pid != old_pid and role.proc.poll() is None:
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    raise Unavailable(f"{name} was not restarted within {timeout_s or self.opts.start_timeout_s}s")
                self._changed.wait(min(left, 0.5))
        self._wait_serving(self.address_of(name), role)
        return role

    def _supervise(self) -> None:
        """Every 0.2 s: restart crashed roles on their ports, with the policy's backoff, until it gives up."""
        policy = self.opts.restart_policy
        while not self._stopping.wait(0.2):
            changed = False
            with self._lock:
                for role in self.roles:
                    if not self._stopping.is_set():
                        changed |= supervise_step(role, policy, self._relaunch)
                if changed:
                    self._changed.notify_all()  # wait_restarted sees restarts and give-ups at once
            if changed:
                self._write_stack_file()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Ends every role: the gateway first, SIGTERM (in-flight calls get their grace), SIGKILL after timeout_s."""
        if not self._workdir_lock.held:  # refused at start (another stack's workdir): nothing here is ours
            return
        self._stopping.set()
        if self._supervisor is not None:
            self._supervisor.join()
            self._supervisor = None
        with self._lock:
            for role in self.roles:
                role.held = True
            roles = list(reversed(self.roles))
        terminate(roles, timeout_s)
        if self._spawner is not None:
            self._spawner.shutdown()
            self._spawner = None
        self.stack_file.unlink(missing_ok=True)
        self.roles = []
        self._workdir_lock.release()

    def _write_stack_file(self) -> None:
        """run/stack.json: every role's name, pid, address and layer range, for `edgeinspect status` and tools."""
        with self._lock:
            roles = [
                {
                    "name": r.name,
                    "role": r.role,
                    "pid": r.pid,
                    "address": f"{self.opts.host}:{r.port}",
                    "layers": list(r.layers) if r.layers else None,
                    "replica": r.replica,
                    "metrics": self.metrics_url(r.name),
                    "restarts": r.restarts,
                    "state": "given_up" if r.given_up else "restarting" if r.proc.poll() is not None else "running",
                    "config": str(r.config_path),
                    "log": str(r.log_path),
                }
                for r in self.roles
            ]
            # "gateway": what a client holds (a pair: both addresses, comma-separated, services/common/gateways.py)
            data = {"launcher_pid": os.getpid(), "gateway": ",".join(self.gateway_addresses), "roles": roles}
            tmp = self.stack_file.with_suffix(".json.tmp")
            tmp.write_text(json.dumps(data, indent=2) + "\n")
            os.replace(tmp, self.stack_file)
