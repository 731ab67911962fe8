"""The sync vocabularies: a resource record's state, an inbox row's status, one fetch's outcome,
one change's outcome (the `outcome` of each entry in `notification.applied`), and the rules a
refusal names. StrEnums, so each member is its JSON/SQLite value unchanged. No I/O here.
"""
from __future__ import annotations

from enum import StrEnum


class ResourceState(StrEnum):
    """`resources.state`: what the Destination holds for one loc."""

    OK = "ok"
    STALE = "stale"            # kept the previous copy: the new bytes did not match length/hash
    FAILED = "failed"          # could not be fetched (reason in last_error); retried
    CONFLICT = "conflict"      # its path is taken: a file where a folder is needed, the reverse, or another loc
    REFUSED = "refused"        # unsafe loc: a host or address the rules refuse
    DELETED = "deleted"        # tombstone: the Source deleted it (kept for newer-wins)


class InboxStatus(StrEnum):
    """`inbox.status`: where one delivery stands."""

    PENDING = "pending"
    APPLIED = "applied"
    COVERED = "covered"        # its interval was already applied (a repeat, or caught up by pull)
    INVALID = "invalid"        # not a change notification; treated as a gap


class FetchOutcome(StrEnum):
    """`FetchResult.outcome`: how one GET into the folder ended."""

    STORED = "stored"
    MISMATCH = "mismatch"      # bytes differ from the announced length/hash: not installed
    GONE = "gone"              # 404 / 410
    FAILED = "failed"          # other errors, after the retries
    CONFLICT = "conflict"      # the file cannot exist there (a file/folder of that name is in the way)
    REFUSED = "refused"        # a trust rule said no (host, origin, symlink, size)


class ChangeOutcome(StrEnum):
    """What applying one change (or Resource List entry) did."""

    STORED = "stored"
    UNCHANGED = "unchanged"
    DELETED = "deleted"
    ABSENT = "absent"
    STALE = "stale"
    FAILED = "failed"
    CONFLICT = "conflict"
    REFUSED = "refused"
    SKIPPED_OLDER = "skipped-older"
    WOULD_FETCH = "would-fetch"  # --dry-run
    WOULD_DELETE = "would-delete"  # --dry-run
    EXCLUDED = "excluded"      # --exclude: left alone (neither fetched nor deleted)


class Refusal(StrEnum):
    """The trust rule a refused loc broke (the `rule` of a `refused` event; counted in `sync status`)."""

    HOST = "host"              # not a DNS name or IP literal, or a host not allowed (--allow-host)
    ORIGIN = "origin"          # the Source's host on another scheme or port
    REDIRECT = "redirect"      # a redirect to another origin
    UNTRACKED = "untracked"    # a delete of a file the state does not track
    SYMLINK = "symlink"        # a symlink in the path inside DIR
    LENGTH = "length"          # the body ran past the announced length
    SIZE = "size"              # the body ran past --max-resource-size
    DEPTH = "depth"            # a loc nested deeper than any real tree (sink.MAX_DEPTH segments)
