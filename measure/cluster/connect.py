"""Connecting to a running Ray cluster, with Ray Client's flaky server start tried again."""

from __future__ import annotations

import logging
from typing import Any

CLIENT_CONNECT_ATTEMPTS = 3
# Ray Client's proxy forks a server per client while its gRPC threads run; now and then the fork
# dies at once (gRPC "Check failed ... KICKED"), and the proxy answers with one of these. The next
# connection forks again, so it is worth retrying; any other error is not.
TRANSIENT_CLIENT_ERRORS = ("Starting Ray client server failed", "Proxy failed to Connect to backend")


def is_transient_client_error(err: BaseException) -> bool:
    """Whether a failed ``ray.init("ray://...")`` is the proxy's flaky server start, worth retrying."""
    return any(marker in str(err) for marker in TRANSIENT_CLIENT_ERRORS)


def init_remote(ray: Any, address: str, common: dict) -> None:
    """``ray.init`` of a running cluster at ``address``, tried again where Ray Client's proxy fails to start
    its server for us (``ray://`` addresses)."""
    attempts = CLIENT_CONNECT_ATTEMPTS if address.startswith("ray://") else 1
    for attempt in range(1, attempts + 1):
        try:
            ray.init(address=address, **common)
            return
        except Exception as err:  # noqa: BLE001 - re-raised unless transient
            if attempt == attempts or not is_transient_client_error(err):
                raise
            logging.getLogger(__name__).warning(
                "Ray Client could not start its server for us (%s); connecting again (%d of %d)",
                err,
                attempt + 1,
                attempts,
            )
            ray.shutdown()
