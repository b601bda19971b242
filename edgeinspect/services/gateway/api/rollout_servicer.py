"""RolloutService: protobuf <-> the RolloutManager (admin tokens only: the auth policy's default for methods it
does not list)."""

from __future__ import annotations

from edgeinspect.services.gateway.rollout.manager import RolloutManager
from edgeinspect.services.gateway.rollout.versions import Version
from edgeinspect.v1 import rollout_pb2, rollout_pb2_grpc

SERVICE_NAME = rollout_pb2.DESCRIPTOR.services_by_name["RolloutService"].full_name


class RolloutServicer(rollout_pb2_grpc.RolloutServiceServicer):
    def __init__(self, manager: RolloutManager):
        self.manager = manager

    async def StartRollout(self, request, context) -> rollout_pb2.RolloutStatus:
        """Connects the candidate and starts shadowing every station."""
        return await self.manager.start(
            Version.from_proto(request.candidate), request.shadow_in_flight, request.shadow_queue
        )

    async def GetRolloutStatus(self, request, context) -> rollout_pb2.RolloutStatus:
        """The versions, the state and the shadow comparison."""
        return await self.manager.status(request.max_disagreements)

    async def PromoteRollout(self, request, context) -> rollout_pb2.RolloutStatus:
        """The candidate live for the given stations (canary) or for all."""
        return await self.manager.promote(list(request.stations))

    async def RollbackRollout(self, request, context) -> rollout_pb2.RolloutStatus:
        """The version live before the rollout, live again everywhere."""
        return await self.manager.rollback()


def register(manager: RolloutManager):
    """The start_server hook that adds the RolloutService over `manager`."""
    return lambda server: rollout_pb2_grpc.add_RolloutServiceServicer_to_server(RolloutServicer(manager), server)
