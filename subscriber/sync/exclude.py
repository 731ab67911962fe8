"""`--exclude GLOB`: the resources a sync and an audit leave alone. No I/O here.

A GLOB is matched (fnmatch, case-sensitive; `*` also crosses "/") against the resource's path
relative to the Source's base, the folder of its Capability List (a loc elsewhere: its path
from its host's root), percent-decoded once like the file names, without a leading "/"; and
against every folder on that path, so `private` or `private/` leaves out all under it; and
against the whole loc, so resync-style patterns on the URI (`https://host/tmp/*`) work too.
`http://host/dataset1/a/b.tmp` under the base `http://host/dataset1/` is `a/b.tmp`, matched by
`*.tmp`, `a`, `a/*` and `http://host/dataset1/a/*`.
"""
from __future__ import annotations

from collections.abc import Sequence
from fnmatch import fnmatchcase
from urllib.parse import unquote, urlsplit

from .sink import host_folder


class Exclusions:
    """The --exclude patterns, read against one Source's base."""

    def __init__(self, patterns: Sequence[str] = (), base: str | None = None) -> None:
        # a trailing "/" names a folder, which the folder matching covers
        self.patterns = tuple(p.rstrip("/") or p for p in patterns)
        self.base_host = ""
        self.base_path = ""          # decoded, no leading "/", ending with "/" when not empty
        self.base_folder = ""        # DIR-relative folder of the base: <host>[_<port>]/<base path>
        if base:
            parts = urlsplit(base)
            self.base_host = parts.netloc.lower()
            folder = unquote(parts.path.rsplit("/", 1)[0] + "/").lstrip("/")
            self.base_path = folder
            try:
                self.base_folder = f"{host_folder(base)}/{folder}"
            except ValueError:
                self.base_folder = ""

    def __bool__(self) -> bool:
        return bool(self.patterns)

    def relative(self, loc: str) -> str:
        """The loc's path relative to the Source's base (decoded, no leading "/")."""
        parts = urlsplit(loc)
        path = unquote(parts.path, errors="surrogateescape").lstrip("/")
        if parts.netloc.lower() == self.base_host and self.base_path and path.startswith(self.base_path):
            path = path[len(self.base_path):]
        return path

    def excludes(self, loc: str) -> bool:
        if not self.patterns:
            return False
        return self._matches(self.relative(loc)) or any(fnmatchcase(loc, p) for p in self.patterns)

    def excludes_file(self, relative: str) -> bool:
        """Whether a file found in DIR (`<host>[_<port>]/<path>`, as the audit walks it) is in
        an excluded part of the tree (its escaped names, if any, are matched as they are)."""
        if not self.patterns:
            return False
        if self.base_folder and relative.startswith(self.base_folder):
            return self._matches(relative[len(self.base_folder):])
        return self._matches(relative.partition("/")[2])

    def _matches(self, path: str) -> bool:
        segments = path.split("/")
        candidates = [path] + ["/".join(segments[:n]) for n in range(1, len(segments))]
        return any(fnmatchcase(candidate, pattern) for candidate in candidates for pattern in self.patterns)
