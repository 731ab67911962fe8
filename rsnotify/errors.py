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
