"""The web console: a server-rendered client of the public gRPC API (stations, reports, review, CSV export)."""
