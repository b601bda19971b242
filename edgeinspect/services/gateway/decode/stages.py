"""The gateway's decoder-stage side in one object: the router (live view, bans), micro-batch groups, the prefix
book, wire options and the recovery policy; `session()` opens one inspection's InferenceSession over them."""

from __future__ import annotations

import dataclasses

from edgeinspect import codec
from edgeinspect.models.checkpoint import Checkpoint
from edgeinspect.services.gateway.decode.pipeline import MicroBatchGroups, PrefixBook, WireOptions
from edgeinspect.services.gateway.decode.routing import StageRouter
from edgeinspect.services.gateway.decode.session import InferenceSession, Journal, RecoveryPolicy
from edgeinspect.services.gateway.replicas.health import gateway_identity
from edgeinspect.v1 import stage_pb2, tensor_pb2


class StageCluster:
    def __init__(self, router: StageRouter, wire: WireOptions, policy: RecoveryPolicy, micro_batches: int = 0):
        self.router = router
        self.wire = wire
        self.policy = policy
        self.micro_batches = micro_batches
        self.groups = MicroBatchGroups(micro_batches or max(len(router.normal_plan()), 1))
        self.prefixes = PrefixBook()

    @classmethod
    async def connect(
        cls,
        addresses: list[str],
        ckpt: Checkpoint,
        wire: WireOptions,
        policy: RecoveryPolicy | None = None,
        micro_batches: int = 0,
        max_message_mb: int = 64,
        wait_s: float = 60.0,
        tls=None,
    ) -> StageCluster:
        """Starts watching the stages and waits until a complete route exists (tests, benchmarks, verify)."""
        router = StageRouter(
            addresses,
            gateway_identity(ckpt.fingerprint, ckpt.tokenizer_fingerprint),
            ckpt.num_layers,
            wire.codec,
            max_message_mb,
            tls=tls,
        )
        router.start()
        try:
            await router.wait_complete(wait_s)
        except BaseException:
            await router.close()
            raise
        policy = policy or RecoveryPolicy(image_token_id=ckpt.config.image_token_id)
        return cls(router, wire, policy, micro_batches)

    def regroup(self) -> None:
        """One micro-batch group per stage of the normal plan, once the stages are known (default)."""
        if not self.micro_batches and sum(self.groups.sessions) == 0:
            self.groups = MicroBatchGroups(max(len(self.router.normal_plan()), 1))

    def session(
        self,
        base_id: str,
        prompt_ids: list[int],
        visual_tokens: tensor_pb2.TensorFrame | None = None,
        sampling: stage_pb2.SamplingParams | None = None,
        *,
        prefix_length: int = 0,
        max_positions: int = 0,
        chunk_tokens: int | None = None,
    ) -> InferenceSession:
        """One inspection's generation (use as `async with`): prefill() then decode() per token."""
        policy = self.policy if chunk_tokens is None else dataclasses.replace(self.policy, chunk_tokens=chunk_tokens)
        journal = Journal(list(prompt_ids), visual_tokens, sampling or stage_pb2.SamplingParams(), prefix_length)
        return InferenceSession(
            self.router, self.groups, self.prefixes, self.wire, base_id, journal, max_positions, policy
        )

    async def close(self) -> None:
        await self.router.close()


def fp32_wire() -> WireOptions:
    return WireOptions(codec.Codec.fp32, False)
