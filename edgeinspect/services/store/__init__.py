"""The report database that the gateway and the line outputs share: its connection (SQLite or PostgreSQL), schema and
migrations (the outbox table included), the claims of a gateway pair and the query helpers. Neither role owns it;
both build on it."""
