"""Keyset pagination cursors: (timestamp, id) of the last row of a page, opaque to clients."""

from __future__ import annotations

import base64
import binascii
import re
from datetime import UTC, datetime


class CursorError(ValueError):
    """A cursor this API did not hand out."""


def encode_cursor(at: datetime, row_id: str) -> str:
    return base64.urlsafe_b64encode(f"{at.isoformat()}|{row_id}".encode()).decode()


_ROW_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:@-]{0,252}")
"""Job ids and diagnosis ids; a forged cursor's id never reaches SQL unchecked."""


def decode_cursor(cursor: str) -> tuple[datetime, str]:
    try:
        text, row_id = base64.urlsafe_b64decode(cursor.encode()).decode().split("|", 1)
        at = datetime.fromisoformat(text)
        valid = at.tzinfo is not None and _ROW_ID.fullmatch(row_id) is not None
        if valid:
            return at.astimezone(UTC), row_id
    except (ValueError, OverflowError, binascii.Error):
        pass
    raise CursorError("cursor: not a cursor this API returned")
