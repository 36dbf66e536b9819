"""What goes wrong with a configuration: every problem as one line naming its key."""

from __future__ import annotations

from typing import TYPE_CHECKING

from edgemon.errors import EdgemonError

if TYPE_CHECKING:
    from collections.abc import Iterable


class ConfigError(EdgemonError, ValueError):
    """A configuration that cannot be used; `problems` lists every reason, one line each.

    Each problem names its key as `section.key`, e.g. `slack.default_margin_ms: must be ≥ 0
    (got -5)`. `source` says where the settings came from (the file, or the environment).
    """

    def __init__(self, problems: Iterable[str], *, source: str = "the settings") -> None:
        self.problems = tuple(problems)
        self.source = source
        super().__init__(f"{self.headline}: {'; '.join(self.problems)}")

    @property
    def headline(self) -> str:
        """`N problems in SOURCE`."""
        count = len(self.problems)
        return f"{count} problem{'' if count == 1 else 's'} in {self.source}"


class CrossFieldError(EdgemonError, ValueError):
    """Raised by a section's validator: problems involving several keys, as (key, message)."""

    def __init__(self, problems: list[tuple[str, str]]) -> None:
        super().__init__("; ".join(f"{key}: {message}" for key, message in problems))
        self.problems = problems
