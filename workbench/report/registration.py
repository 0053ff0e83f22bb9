"""Pre-registration: a `margin:` or a Published-findings row written after its study's first
result is *post hoc*. The report states it beside the verdict; the index marks it; a post-hoc
findings row is shown but not counted as agreeing or disagreeing."""

from __future__ import annotations

from datetime import datetime, timezone


def utc(moment: datetime | str) -> datetime:
    """A time as an aware UTC datetime (naive times, as study files write them, are UTC)."""
    value = datetime.fromisoformat(moment) if isinstance(moment, str) else moment
    return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)


def minute(moment: datetime | str) -> str:
    return utc(moment).strftime("%Y-%m-%d %H:%M UTC")


def post_hoc(registered: datetime | str | None, first_result: datetime | str | None) -> str:
    """'registered 2026-12-01 09:30 UTC, after the study's first result (2026-11-30 15:02 UTC)',
    or '' when registered before it or when either time is unknown."""
    if registered is None or first_result is None or utc(registered) <= utc(first_result):
        return ""
    return f"registered {minute(registered)}, after the study's first result ({minute(first_result)})"
