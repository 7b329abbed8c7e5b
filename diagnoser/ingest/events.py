"""Job lifecycle events: exit codes and signals, normalised because they are evidence."""

from __future__ import annotations

import signal as signals


def signal_name(exit_code: int | None, signal: str | int | None) -> str | None:
    """`SIGKILL` from any of: 'SIGKILL', 'kill', 9, '9', exit code -9 or 137 (128 + 9)."""
    number: int | None = None
    if isinstance(signal, int):
        number = signal
    elif isinstance(signal, str) and signal.strip():
        text = signal.strip().upper()
        if text.isdigit():
            number = int(text)
        else:
            name = text if text.startswith("SIG") else f"SIG{text}"
            return name if name in signals.Signals.__members__ else signal.strip()
    elif exit_code is not None and exit_code < 0:
        number = -exit_code
    elif exit_code is not None and exit_code > 128:
        number = exit_code - 128
    if number is None:
        return None
    try:
        return signals.Signals(number).name
    except ValueError:
        return f"signal {number}"
