"""Keyset pagination cursors: (timestamp, id) of the last row of a page, opaque to clients."""

from __future__ import annotations

import base64
import binascii
from datetime import datetime


class CursorError(ValueError):
    """A cursor this API did not hand out."""


def encode_cursor(at: datetime, row_id: str) -> str:
    return base64.urlsafe_b64encode(f"{at.isoformat()}|{row_id}".encode()).decode()


def decode_cursor(cursor: str) -> tuple[datetime, str]:
    try:
        at, row_id = base64.urlsafe_b64decode(cursor.encode()).decode().split("|", 1)
        return datetime.fromisoformat(at), row_id
    except (ValueError, binascii.Error) as exc:
        raise CursorError("cursor: not a cursor this API returned") from exc
