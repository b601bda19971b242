"""Webhook output: each result as a signed HTTP POST.

The signature covers a timestamp and the body (`sha256=` HMAC-SHA256 of `<timestamp>.<body>`), so a receiver can
reject both forged and replayed deliveries. 5xx, 408, 429 and connection errors are retried (the worker backs
off); any other 4xx means the receiver will never take this body: it is dropped and counted.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import time
import urllib.error
import urllib.request
from urllib.parse import urlsplit

from edgeinspect.services.outputs.config import WebhookConfig

SIGNATURE_HEADER = "X-EdgeInspect-Signature"
TIMESTAMP_HEADER = "X-EdgeInspect-Timestamp"
DELIVERY_HEADER = "X-EdgeInspect-Delivery"  # the report id: receivers dedupe on it
RETRIED_4XX = (408, 429)


class Rejected(Exception):
    """The receiver refused the delivery for good (a 4xx other than 408/429)."""


def sign(secret: str, timestamp: str, body: bytes) -> str:
    mac = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    return f"sha256={mac.hexdigest()}"


def verify(secret: str, timestamp: str, body: bytes, signature: str, max_age_s: float = 300.0) -> bool:
    """What a receiver runs: the signature matches and the timestamp is recent."""
    try:
        fresh = abs(time.time() - float(timestamp)) <= max_age_s
    except ValueError:
        return False
    return fresh and hmac.compare_digest(sign(secret, timestamp, body), signature)


class WebhookOutput:
    def __init__(self, cfg: WebhookConfig, name: str) -> None:
        self.cfg = cfg
        self.name = name
        parts = urlsplit(cfg.url)  # scheme://host:port only: a URL's path or query may carry a token
        self.peer = f"webhook {parts.scheme}://{parts.hostname}" + (f":{parts.port}" if parts.port else "")

    async def send(self, key: str, payload: bytes) -> None:
        await asyncio.to_thread(self._post, key, payload)

    def _post(self, key: str, payload: bytes) -> None:
        timestamp = f"{time.time():.3f}"
        request = urllib.request.Request(
            self.cfg.url,
            data=payload,
            method="POST",
            headers={
                "Content-Type": "application/json",
                SIGNATURE_HEADER: sign(self.cfg.secret, timestamp, payload),
                TIMESTAMP_HEADER: timestamp,
                DELIVERY_HEADER: key,
            },
        )
        try:
            with urllib.request.urlopen(request, timeout=self.cfg.timeout_s) as resp:
                resp.read()
        except urllib.error.HTTPError as exc:
            if 400 <= exc.code < 500 and exc.code not in RETRIED_4XX:
                raise Rejected(f"{self.cfg.url} answered {exc.code} {exc.reason}") from exc
            raise ConnectionError(f"{self.cfg.url} answered {exc.code} {exc.reason}") from exc
        except (urllib.error.URLError, TimeoutError, OSError) as exc:
            raise ConnectionError(f"{self.cfg.url} unreachable: {getattr(exc, 'reason', exc)}") from exc

    async def close(self) -> None:
        pass
