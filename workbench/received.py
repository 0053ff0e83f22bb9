"""Reading what a received folder holds: a results folder, a run folder, a report folder may
come from someone else, and hold links, FIFOs, devices, huge or deeply nested files planted to
make a command read or write elsewhere, block forever, or exhaust memory.

    check_regular(path)      lstat only: a regular file, absent, or refused (link, FIFO, ...)
    open_regular(path)       opened without following a link and without blocking on a FIFO
    read_regular(path, max)  its bytes, at most `max`
    load_json(data, what)    JSON bounded in depth and values, without NaN or Infinity,
                             refused with `what` named

Every refusal is one UnsafeFile (a WorkbenchError) or ValueError naming the file or field.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path
from typing import BinaryIO

from workbench.errors import WorkbenchError


class UnsafeFile(WorkbenchError):
    """A file a command would read is a link, a FIFO, a device or a folder, or is too large."""


def check_regular(path: str | Path) -> bool:
    """True when `path` is a regular file, False when it is absent; UnsafeFile for a symbolic
    link or anything else (lstat: nothing is opened, so a FIFO cannot block)."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return False
    if stat.S_ISLNK(mode):
        raise UnsafeFile(link_error(Path(path), Path(path).parent).args[0])
    if not stat.S_ISREG(mode):
        raise not_regular(path, mode)
    return True


def not_regular(path: str | Path, mode: int) -> UnsafeFile:
    kind = next((name for test, name in ((stat.S_ISDIR, "folder"), (stat.S_ISFIFO, "FIFO"), (stat.S_ISSOCK, "socket"),
                                         (stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device"))
                 if test(mode)), "special file")
    return UnsafeFile(f"{path} is not a regular file (a {kind}); the workbench reads only files it wrote there: "
                      "remove it (or copy the folder without it) and run again")


def open_regular(path: str | Path) -> BinaryIO:
    """`path` opened for reading if it is a regular file: never through a link, and without
    blocking (O_NONBLOCK: opening a FIFO returns at once, then fstat refuses it); UnsafeFile
    for a link or a file that is not regular, FileNotFoundError when it is absent."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as err:
        if err.errno == errno.ELOOP:  # O_NOFOLLOW met a link
            check_regular(path)
        raise
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise not_regular(path, mode)
    return os.fdopen(fd, "rb")


def read_regular(path: str | Path, max_bytes: int) -> bytes:
    """The bytes of the regular file `path` (open_regular); UnsafeFile when over `max_bytes`."""
    with open_regular(path) as file:
        data = file.read(max_bytes + 1)  # a file growing meanwhile is cut here too
    if len(data) > max_bytes:
        raise UnsafeFile(f"{path} is over {max_bytes / 2**20:.3g} MiB, more than the workbench writes there: "
                         "move it away and run again")
    return data


MAX_JSON_DEPTH = 32  # a run config nests about 5 levels; a crafted file, thousands
MAX_JSON_VALUES = 2_000_000  # a long run's curves: a few hundred thousand values


def load_json(data: str | bytes, what: str, max_depth: int = MAX_JSON_DEPTH, max_values: int = MAX_JSON_VALUES,
              non_finite_as_null: bool = False):
    """JSON from a file or store column the workbench may not have written: ValueError naming
    `what` for invalid JSON, NaN or Infinity (never written: values that are not finite are
    recorded as null; `non_finite_as_null` reads them as null, as stores written before did
    write them), nesting deeper than `max_depth` or more than `max_values` values."""

    def refuse_constant(name: str):
        if non_finite_as_null:
            return None
        raise ValueError(f"{what}: {name} is not a finite number")

    try:
        value = json.loads(data, parse_constant=refuse_constant)
    except RecursionError:  # the C parser's own bound (a thousand levels), met long before a stack overflow
        raise ValueError(f"{what}: nested over {max_depth} levels deep") from None
    except json.JSONDecodeError as err:
        raise ValueError(f"{what}: not valid JSON ({err.msg} at line {err.lineno} column {err.colno})") from None
    except UnicodeDecodeError:
        raise ValueError(f"{what}: not UTF-8 text") from None
    values, level = 0, [value]
    for depth in range(max_depth + 1):
        if not level:
            return value
        values += len(level)
        if values > max_values:
            raise ValueError(f"{what}: holds over {max_values} values, more than the workbench writes")
        level = [item for node in level if isinstance(node, (dict, list))
                 for item in (node.values() if isinstance(node, dict) else node)]
    raise ValueError(f"{what}: nested over {max_depth} levels deep")


def link_error(link: Path, root: Path) -> WorkbenchError:
    try:
        target = os.readlink(link)
    except OSError:
        target = "?"
    return WorkbenchError(f"{link} is a symbolic link (to {target}); the workbench writes only inside {root} and "
                          "follows no link there: remove the link (or copy the folder without links) and run again")
