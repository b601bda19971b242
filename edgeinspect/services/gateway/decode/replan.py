"""Re-planning onto surviving boxes: a layer range left without any usable stage is merged into a neighbour.

What the plant's design asks for: "migrate the failed stage's layers to healthy devices; merge its load into a
neighbour and keep serving, slower". The neighbour (the usable endpoint whose range ends where the gap starts, or
starts where it ends) is asked to serve the union with LoadLayers; the stage checks that it fits its memory and
refuses otherwise, and the next neighbour is tried. In-flight sessions on the neighbour lose their cache and are
replayed by their InferenceSession. When the box that served the range by its own config has been usable for
`replan_settle_s`, the neighbour goes back to its own range and the normal plan is in force again.
"""

from __future__ import annotations

import logging
import time

import grpc

from edgeinspect.models.checkpoint import Checkpoint
from edgeinspect.services.gateway.decode.routing import Endpoint, StageRouter, fmt_range, missing_ranges
from edgeinspect.services.gateway.settings import GatewaySettings
from edgeinspect.v1 import stage_pb2

log = logging.getLogger(__name__)
LOAD_TIMEOUT_S = 600.0  # loading a 1.3B range from disk takes seconds; a slow SD card much longer
RETRY_AFTER_S = 10.0


def merge_candidates(gap: tuple[int, int], usable: list[Endpoint]) -> list[tuple[Endpoint, tuple[int, int]]]:
    """Neighbours that can take the gap with the range each would serve, the fewest layers added first."""
    a, b = gap
    out = []
    for ep in usable:
        if ep.layer_end == a:
            out.append((ep, (ep.layer_start, b)))
        elif ep.layer_start == b:
            out.append((ep, (a, ep.layer_end)))
    return sorted(out, key=lambda c: (c[1][1] - c[1][0], c[0].sessions))


class Replanner:
    def __init__(self, router: StageRouter, ckpt: Checkpoint, cfg: GatewaySettings):
        self.router = router
        self.enabled = cfg.replan
        self.settle_s = cfg.replan_settle_s
        self.moved: dict[str, tuple[int, int]] = {}  # endpoint -> its own range, while it serves a merged one
        self._gave_up: dict[tuple[int, int], float] = {}  # gap -> when to try again
        self._usable_since: dict[str, float] = {}

    async def close(self) -> None:
        """Nothing to release: re-planned stages keep serving what they serve until they are told or restart."""

    async def cover_gaps(self) -> None:
        """Merges every layer range without a usable stage into a neighbour that has the memory for it."""
        if not self.enabled:
            return
        usable = self.router.usable()
        if not usable or any(ep.home is None for ep in self.router.endpoints):
            return  # a box never seen is still starting, not failed: its range is not re-planned
        now = time.monotonic()
        # Only layers whose every stage is down or refused are re-planned: a stage banned after a stall is still
        # up and is probed back in within seconds (moving its layers would cost every session a replay).
        alive = [ep for ep in self.router.endpoints if ep.serving and ep.verified and not ep.mismatch]
        for gap in missing_ranges([ep.range for ep in alive], self.router.num_layers):
            if self._gave_up.get(gap, 0.0) > now:
                continue
            for ep, new_range in merge_candidates(gap, usable):
                if await self._load(ep, new_range, f"covering layers {fmt_range(*gap)}"):
                    self.moved.setdefault(ep.address, ep.home or (ep.layer_start, ep.layer_end))
                    break
            else:
                self._gave_up[gap] = now + RETRY_AFTER_S
                log.error("no surviving stage can take layers %s; the cluster is not serving", fmt_range(*gap))
                self.router.events.note(f"re-plan impossible: no stage can take layers {fmt_range(*gap)}")
            return  # one move per round: the router's view changes with it

    async def restore_when_settled(self) -> None:
        """Sends a merged stage back to its own range once the boxes of that plan have been usable for a while."""
        if not self.moved:
            return
        now = time.monotonic()
        usable = self.router.usable()
        by_address = {ep.address: ep for ep in self.router.endpoints}
        for ep in usable:
            self._usable_since.setdefault(ep.address, now)
        for address in list(self._usable_since):
            if address not in {ep.address for ep in usable}:
                del self._usable_since[address]
        for address, home in list(self.moved.items()):
            ep = by_address[address]
            if ep.range == home:
                del self.moved[address]
                continue
            # The layers it took over must again have a usable home, settled for settle_s.
            others = [o for o in usable if o is not ep and o.home == o.range]
            rest = missing_ranges([o.range for o in others] + [home], self.router.num_layers)
            settled = all(now - self._usable_since.get(o.address, now) >= self.settle_s for o in others)
            if not rest and settled and await self._load(ep, home, "back to the normal plan"):
                del self.moved[address]
                return

    async def _load(self, ep: Endpoint, new_range: tuple[int, int], why: str) -> bool:
        log.warning("re-planning: %s %s -> %s (%s)", ep.address, ep.name, fmt_range(*new_range), why)
        try:
            await ep.stub.LoadLayers(
                stage_pb2.LoadLayersRequest(layer_start=new_range[0], layer_end=new_range[1]), timeout=LOAD_TIMEOUT_S
            )
        except grpc.aio.AioRpcError as exc:
            log.warning("re-planning: %s refused %s: %s", ep.address, fmt_range(*new_range), exc.details())
            return False
        await self.router.rehandshake(ep)
        self.router.events.note(f"re-planned: {ep.address} now serves {ep.name} ({why})")
        return ep.verified and ep.range == new_range
