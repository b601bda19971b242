"""The public edge: gRPC servicers (inspection, rollout), who is calling, the cluster status answer."""
