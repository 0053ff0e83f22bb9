"""An output folder's safety: one writer at a time, and nothing that reaches outside it.

    WriterLock(out)          the one `workbench run` writing `out`: an exclusive flock on the
                             folder itself, so deleting `.workbench.lock` (which only names the
                             holder) cannot admit a second writer
    running_writer(out)      the pid of the `workbench run` writing `out` now, if any
    refuse_links(root, ...)  a received folder may hold symbolic links planted to make the
                             workbench write or delete elsewhere: refused before anything is written
    check_run_id(run_id)     a run id read from a store is a path component: its pattern is checked
    default_reports_dir(out) where a report of `out` goes unless told: beside it, never into the
                             checkout's tracked reports/

Reading files there (never through a link, never from a FIFO) is workbench.results' read_regular.

Processes that write for the lock's holder (a sweep's workers, a multi-device run's ranks)
take no lock: the driver holds it for them.
"""

from __future__ import annotations

import errno
import os
import re
from contextlib import suppress
from pathlib import Path

from workbench.errors import WorkbenchError
from workbench.results import link_error, read_regular
from workbench.results import write_text_atomic

LOCK_FILE = ".workbench.lock"  # out_dir/.workbench.lock: the pid of the sweep writing the folder
RUN_ID = re.compile(r"[0-9a-f]{12}")  # workbench.study.keys.digest: 12 hex digits


class WriterLock:
    """The one writer of an output folder, from before --fresh clears anything until the sweep
    ends: fcntl.flock on the folder's own descriptor (the OS releases it on any exit), and the
    holder's pid in LOCK_FILE for the message a second writer gets."""

    def __init__(self, out_dir: str | Path):
        self.out_dir = Path(out_dir)
        self.path = self.out_dir / LOCK_FILE
        self.fd: int | None = None

    def __enter__(self) -> WriterLock:
        import fcntl  # POSIX only: importing the store must work everywhere, locking is checked here

        try:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.out_dir, os.O_RDONLY | os.O_DIRECTORY)
        except OSError as err:
            raise WorkbenchError(f"{self.out_dir}: cannot write here ({err.strerror}); use --out for a "
                                 "writable folder") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            os.close(fd)
            if err.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                raise WorkbenchError(f"{self.out_dir}: cannot lock the folder ({err.strerror}); use --out for a "
                                     "folder on a local disk") from None
            raise WorkbenchError(f"{self.out_dir} is being written by another `workbench run` (pid {self.holder()}); "
                                 "wait for it to end, or use --out for another folder") from None
        self.fd = fd
        try:
            write_text_atomic(self.path, f"{os.getpid()}\n")  # replaces a planted link, never follows it
        except OSError as err:
            self.__exit__()
            raise WorkbenchError(f"{self.out_dir}: cannot write here ({err.strerror}); use --out for a "
                                 "writable folder") from None
        return self

    def holder(self) -> str:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            return "unknown"
        try:
            return os.read(fd, 32).decode(errors="replace").strip() or "unknown"
        finally:
            os.close(fd)

    def __exit__(self, *exc) -> None:
        if self.fd is not None:
            with suppress(OSError):
                self.path.unlink()
            os.close(self.fd)  # closing releases the flock
            self.fd = None


def running_writer(out_dir: str | Path) -> int | None:
    """The pid of the `workbench run` writing `out_dir` now (its lock file names a live process),
    else None. Read, never locked: a reader must not turn a writer starting meanwhile away."""
    try:
        pid = int(read_regular(Path(out_dir) / LOCK_FILE, 32))
        os.kill(pid, 0)  # signal 0: is it alive (nothing is sent)
    except (OSError, ValueError, WorkbenchError):  # absent, unreadable, not a pid, no such process
        return None
    return pid if pid > 0 else None


def refuse_links(root: str | Path, *names: str) -> None:
    """Refuse when root/<name>, or anything below it, is a symbolic link: the workbench writes
    and deletes there and must not follow a link out of the folder. Missing names are fine."""
    root = Path(root)
    for name in names:
        path = root / name
        for part in (path, *[p for p in path.parents if root in p.parents]):
            if part.is_symlink():
                raise link_error(part, root)
        if path.is_dir():
            for folder, dirs, files in os.walk(path):  # os.walk does not follow links into folders
                for entry in (*dirs, *files):
                    if (Path(folder) / entry).is_symlink():
                        raise link_error(Path(folder) / entry, root)


def check_run_id(run_id: str) -> str:
    """`run_id` if it has the pattern of a run id (12 hex digits), else the one-line refusal:
    an id read from a received store must not name a path (`../x`)."""
    if not isinstance(run_id, str) or not RUN_ID.fullmatch(run_id):
        raise WorkbenchError(f"{str(run_id)[:40]!r} is not a run id (12 hex digits): the results store holds a "
                             "damaged or crafted row; move it away and run the study again")
    return run_id


def default_reports_dir(out_dir: str | Path, study_name: str | None) -> Path:
    """A report goes beside its results, in OUT/reports/: a run of a shipped study never
    overwrites the shipped report in the checkout's reports/ (which is tracked: `make quickstart`
    must leave a clone as it was), and `workbench diff` then compares the two. The one exception
    is a report's own shipped data (REPORTS/<study name>/data): that rebuilds the report around it."""
    out_dir = Path(out_dir)
    if study_name is not None and out_dir.name == "data" and out_dir.parent.name == study_name:
        return out_dir.parent.parent  # a report's shipped data (reports/NAME/data): rebuild that report
    refuse_links(out_dir, "reports")  # a received folder's own `reports` must not lead elsewhere
    return out_dir / "reports"
