"""The gateway's replicas of the roles it calls: health following, bans and probes for stages, vision and retrieval
alike (health.py), the replica set of a stateless role (replica_set.py) and the vision and retrieval clients on top
of it (clients.py)."""
