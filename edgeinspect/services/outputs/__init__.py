"""Where a stored report goes next: MQTT, webhooks (the gateway or ingest hosts them), one result contract."""
