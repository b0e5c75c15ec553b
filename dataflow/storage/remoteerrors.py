"""What went wrong reaching a remote store, from an fsspec/botocore/aiohttp exception.

:func:`is_throttle` and :func:`is_connect_failure` decide what the retry loop of
:class:`~dataflow.storage.remote.Remote` does; :func:`describe` turns any failure into one
line naming the endpoint or bucket and the likely fix. Decisions read structured fields (botocore's
``Error.Code``, HTTP statuses) along the cause chain, never digits in a message, so a shard
named ``train-000503.tar`` is not a 503.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

_THROTTLE_CODES = frozenset({"SlowDown", "Throttling", "ThrottlingException", "TooManyRequests",
                             "RequestLimitExceeded", "ServiceUnavailable"})
_THROTTLE_TEXT = ("(SlowDown)", "reduce your request rate")
_THROTTLE_STATUS = frozenset({429, 503})
_CONNECT = ("EndpointConnectionError", "ClientConnectorError", "Could not connect",
            "Cannot connect", "Connection refused", "Name or service not known", "getaddrinfo",
            "ConnectTimeout", "ConnectionRefusedError")
_DENIED_CODES = frozenset({"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch",
                           "ExpiredToken", "InvalidToken", "AllAccessDisabled"})
_DENIED_TEXT = ("NoCredentialsError", "Unable to locate credentials", "(AccessDenied)",
                "(InvalidAccessKeyId)", "(SignatureDoesNotMatch)", "Forbidden")


def endpoint_of(url: str, options: Mapping[str, Any]) -> str:
    """Where requests for ``url`` go: the configured endpoint, an HTTP host, or the
    protocol's default."""
    if url.startswith(("http://", "https://")):
        return "/".join(url.split("/")[:3])
    nested = options.get("client_kwargs") or {}
    found = options.get("endpoint_url") or (nested.get("endpoint_url")
                                            if isinstance(nested, dict) else None)
    return str(found) if found else f"the default {url.split('://')[0]} endpoint"


def _links(e: BaseException) -> list[BaseException]:
    out: list[BaseException] = []
    cur: BaseException | None = e
    while cur is not None and all(cur is not o for o in out):
        out.append(cur)
        cur = cur.__cause__ or cur.__context__
    return out


def _chain(e: BaseException) -> str:
    return " | ".join(f"{type(x).__name__} {x}" for x in _links(e))


def _codes(e: BaseException) -> tuple[set[str], set[int]]:
    """Error codes (botocore ``Error.Code``) and HTTP statuses found along the cause chain."""
    codes: set[str] = set()
    statuses: set[int] = set()
    for x in _links(e):
        response = getattr(x, "response", None)
        if isinstance(response, dict):
            codes.add(str(response.get("Error", {}).get("Code", "")))
            status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if isinstance(status, int):
                statuses.add(status)
        status = getattr(x, "status", None)
        if isinstance(status, int):
            statuses.add(status)
    return codes, statuses


def is_throttle(e: BaseException) -> bool:
    """Whether ``e`` is a throttling reply (S3 SlowDown, HTTP 503/429)."""
    codes, statuses = _codes(e)
    return bool(codes & _THROTTLE_CODES or statuses & _THROTTLE_STATUS
                or any(t in _chain(e) for t in _THROTTLE_TEXT))


def is_connect_failure(e: BaseException) -> bool:
    """Whether ``e`` is a failure to reach the endpoint at all."""
    return isinstance(e, ConnectionRefusedError) or any(t in _chain(e) for t in _CONNECT)


def describe(e: BaseException, url: str, options: Mapping[str, Any]) -> str:
    """One line saying what went wrong reaching ``url`` and what to check."""
    text = _chain(e)
    endpoint = endpoint_of(url, options)
    bucket = url.split("://", 1)[-1].split("/", 1)[0]
    if "NoSuchBucket" in text or "bucket does not exist" in text.lower():
        return f"bucket {bucket!r} does not exist at {endpoint}"
    if is_connect_failure(e):
        return (f"cannot connect to {endpoint}: check the endpoint "
                "(--storage-option endpoint_url=...) and the network")
    codes, statuses = _codes(e)
    if (codes & _DENIED_CODES or statuses & {401, 403} or isinstance(e, PermissionError)
            or any(t in text for t in _DENIED_TEXT)):
        return (f"access denied at {endpoint}: check the credentials (--storage-option "
                "key=... secret=..., or the AWS_*/GOOGLE_* environment) and the permissions "
                f"on bucket {bucket!r}")
    if isinstance(e, FileNotFoundError) or "NoSuchKey" in codes or 404 in statuses:
        return f"no such object at {endpoint}"
    first = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{type(e).__name__}: {first[:300]}"
