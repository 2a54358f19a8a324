"""Reading a file the user named (spec, overlay, secrets, fingerprints, `parse` input, known_hosts): one bounded
reader for all of them.

The type and size are checked on the open file before anything is read, so a FIFO (which blocks an open or a
read for ever when nobody writes), a device such as /dev/zero, a directory or a huge file is refused at once with
one line naming the path, instead of hanging the command, filling memory or ending in a traceback. Messages name
the file and the problem, never the file's content (a secrets file's text is secret).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from provisioner.errors import UsageError

MAX_USER_FILE_BYTES = 16 * 1024 * 1024
"""The most any user-named input file may hold (a 16,384-node spec is about 2 MiB)."""


def read_user_bytes(path: str | os.PathLike[str], what: str, *, hint: str | None = None,
                    limit: int = MAX_USER_FILE_BYTES) -> bytes:
    """The bytes of ``path``, a regular file of at most ``limit`` bytes; ``what`` says what it should be
    ("a spec file", "a secrets file"): it ends the error line."""
    p = Path(path)
    try:  # O_NONBLOCK: opening a FIFO with no writer returns at once instead of waiting for one
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    except FileNotFoundError:
        raise UsageError(f"{p}: no such file, expected {what}", hint=hint) from None
    except IsADirectoryError:
        raise UsageError(f"{p}: is a directory, expected {what}", hint=hint) from None
    except OSError as exc:
        raise UsageError(f"{p}: cannot open ({exc.strerror or exc}), expected {what}", hint=hint) from None
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise UsageError(f"{p}: is a directory, expected {what}", hint=hint)
        if not stat.S_ISREG(st.st_mode):
            raise UsageError(f"{p}: not a regular file (a pipe or a device), expected {what}", hint=hint)
        if st.st_size > limit:
            raise UsageError(f"{p}: {st.st_size} bytes is too large for {what} (at most {limit})", hint=hint)
        with os.fdopen(os.dup(fd), "rb") as fh:
            data = fh.read(limit + 1)  # a file that grew since the fstat is still cut at the limit
    except OSError as exc:
        raise UsageError(f"{p}: cannot read ({exc.strerror or exc}), expected {what}", hint=hint) from None
    finally:
        os.close(fd)
    if len(data) > limit:
        raise UsageError(f"{p}: more than {limit} bytes is too large for {what}", hint=hint)
    return data


def read_user_text(path: str | os.PathLike[str], what: str, *, hint: str | None = None,
                   limit: int = MAX_USER_FILE_BYTES) -> str:
    """:func:`read_user_bytes` decoded as UTF-8; anything else is refused naming the first bad byte's offset."""
    data = read_user_bytes(path, what, hint=hint, limit=limit)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"{path}: not UTF-8 text (byte {exc.start}), expected {what}",
                         hint=hint or "save it as UTF-8") from None
