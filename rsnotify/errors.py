"""Errors of the shared vocabulary.

RsnotifyError
├── NotificationError          a model value is out of range (raised in __post_init__)
│   └── DatetimeError          a text is not a W3C datetime (rsnotify.datetimes)
├── DocumentParseError         bytes are not a well-formed, safe XML document of a known kind
│   └── NotificationParseError the document is not a change notification at all
├── ValidationError            a document parsed but breaks the spec's rules; .problems lists all
└── WireError                  a WebSub wire value is malformed (Link header, signature header,
                               subscription form field); .problems lists every problem
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


class RsnotifyError(Exception):
    """Base of every error raised by the rsnotify vocabulary."""


class NotificationError(RsnotifyError, ValueError):
    """A model object was built with a value the spec does not allow."""


class DatetimeError(NotificationError):
    """A text is not a W3C datetime (the profile of NOTE-datetime-19980827)."""


class DocumentParseError(RsnotifyError, ValueError):
    """The bytes are not a well-formed, safe XML document of a kind rsnotify knows."""


class NotificationParseError(DocumentParseError):
    """The document is not a change notification."""


class _ProblemsError(RsnotifyError, ValueError):
    """An error that carries every problem found, one line each."""

    def __init__(self, problems: list[str] | str) -> None:
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        super().__init__("\n".join(self.problems))


class ValidationError(_ProblemsError):
    """A document parsed, but breaks the spec's rules; `problems` lists each one."""


class WireError(_ProblemsError):
    """A WebSub wire value (Link header, signature, form field) is malformed."""


class Problems:
    """Parse several values and report every problem at once, not only the first.

        problems = Problems()
        topic = problems.check(check_url, "hub.topic", form.get("hub.topic"))
        ...
        problems.raise_if_any(WireError)     # one error listing each problem, one line each
    """

    def __init__(self) -> None:
        self.items: list[str] = []

    def check(self, parse: Callable[..., T], *args: Any) -> T | None:
        """`parse(*args)`, or None with its problems noted when it raises a problems error."""
        try:
            return parse(*args)
        except _ProblemsError as exc:
            self.items.extend(exc.problems)
            return None

    def add(self, problem: str) -> None:
        self.items.append(problem)

    def __bool__(self) -> bool:
        return bool(self.items)

    def raise_if_any(self, error: Callable[[list[str]], BaseException]) -> None:
        if self.items:
            raise error(self.items)
