"""Errors of the hub; each HubError carries the HTTP status the app's middleware answers with.

HubError                      status 400 unless a subclass says otherwise
├── BadRequestError           400  a form, header or body is malformed (every problem listed)
├── UnsupportedMediaError     415  a POST whose Content-Type the hub does not take
├── AuthenticationError       401  no or unknown publisher token
├── ForbiddenError            403  the token (or the client address) may not publish this topic
├── NotFoundError             404  no such topic, subscription or dead letter (admin API, diagnostics)
├── RequestTimeoutError       408  the body did not arrive within --body-timeout
├── PayloadTooLargeError      413  the body is larger than --max-body (a form: --max-form)
├── MisdirectedRequestError   421  the Host header names neither this hub nor localhost
├── IdempotencyConflictError  422  an Idempotency-Key already used with another body (nothing stored)
├── TooManyRequestsError      429  a rate limit is reached; `retry_after` (seconds) goes in Retry-After
├── UnavailableError          503  Redis or the queue cannot be reached right now (with Retry-After)
│   ├── ReplicasBehindError   503  a publish is stored, but fewer than --min-replicas replicas confirmed it
│   └── AppendUnknownError    503  a publish's append failed in a way that may have stored it
SettingsError                 bad configuration (the CLI turns it into a usage error)
OutboundRefusedError          an outbound request's target resolves to a refused address
"""
from __future__ import annotations


class HubError(Exception):
    """A request the hub refuses; `str()` is the text/plain reason sent back."""

    status = 400

    def __init__(self, problems: list[str] | str) -> None:
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        super().__init__("\n".join(self.problems))


class BadRequestError(HubError):
    status = 400


class UnsupportedMediaError(HubError):
    status = 415


class AuthenticationError(HubError):
    status = 401


class ForbiddenError(HubError):
    status = 403


class NotFoundError(HubError):
    status = 404


class RequestTimeoutError(HubError):
    status = 408


class PayloadTooLargeError(HubError):
    status = 413


class MisdirectedRequestError(HubError):
    status = 421


class IdempotencyConflictError(HubError):
    status = 422


class TooManyRequestsError(HubError):
    status = 429

    def __init__(self, problems: list[str] | str, retry_after: int) -> None:
        super().__init__(problems)
        self.retry_after = max(1, retry_after)


class UnavailableError(HubError):
    status = 503

    def __init__(self, problems: list[str] | str, retry_after: int = 5) -> None:
        super().__init__(problems)
        self.retry_after = max(1, retry_after)


class ReplicasBehindError(UnavailableError):
    # the publish may be lost with the primary: the publisher sends it again with the same
    # Idempotency-Key, and the hub stores it once (or finds the stored one and waits again)
    pass


class AppendUnknownError(UnavailableError):
    # a failover cuts a command off mid-flight: the notification may be stored. 503 + Retry-After
    # (not 500: the hub is not broken, it is between primaries); the message tells the publisher
    # that only a repeat with the same Idempotency-Key finds out without storing it twice
    pass


class SettingsError(Exception):
    """A setting is invalid; `problems` lists every one."""

    def __init__(self, problems: list[str] | str) -> None:
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        super().__init__("\n".join(self.problems))


class OutboundRefusedError(OSError):
    """An outbound connection was refused by the address guard (an OSError, so aiohttp treats
    it as a failed connection attempt and tries the next address, if any)."""
