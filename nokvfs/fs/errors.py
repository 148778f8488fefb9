"""The one place where nokvfs errors become errnos.

Every handler in `nokvfs.fs.operations` runs inside `translated()`: a typed nokvfs error becomes
`FUSEError(errno)` with one log line that says why, an OSError keeps its errno, and anything else
is logged with its traceback and answered with EIO. A request never crashes the daemon.

Choices the kernel's errno vocabulary leaves open:

* a lost generation race (another writer published first) is EBUSY; when the losing writer was
  creating the file (expected generation 0) it is EEXIST. close(2) returns it, the spool is kept.
* a fenced owner epoch or root fence (another process took the shard over) is EROFS: this mount
  can no longer write anything.
* a full store or disk is ENOSPC; any upload, download or integrity failure is EIO.
* reserved paths (the sections, `metadata/run_manifest.json`, `metadata/restore_manifest.json`)
  are EPERM; read-only views and `--read-only` mounts are EROFS.
"""

from __future__ import annotations

import contextlib
import errno
import logging

import pyfuse3

from nokvfs import errors as E

log = logging.getLogger(__name__)

# Most specific first: the first isinstance match wins.
_TABLE: tuple[tuple[type, int], ...] = (
    (E.GenerationConflict, errno.EBUSY),
    (E.ReadVersionStale, errno.EAGAIN),
    (E.OwnerFenced, errno.EROFS),
    (E.FenceError, errno.EROFS),
    (E.RequestMismatch, errno.EIO),
    (E.CommandTooLarge, errno.EFBIG),
    (E.PredicateFailed, errno.EBUSY),
    (E.CommandRejected, errno.EIO),
    (E.ReservedPath, errno.EPERM),
    (E.NotADirectory, errno.ENOTDIR),
    (E.IsADirectory, errno.EISDIR),
    (E.PathInvalid, errno.EINVAL),
    (E.NameInvalid, errno.EINVAL),
    (E.InvalidInput, errno.EINVAL),
    (E.NotFound, errno.ENOENT),
    (E.AlreadyExists, errno.EEXIST),
    (E.HistoryNotRetained, errno.ENOENT),
    (E.StoreFull, errno.ENOSPC),
    (E.StoreError, errno.EIO),
    (E.IntegrityError, errno.EIO),
    (E.FormatError, errno.EIO),
    (E.NokvError, errno.EIO),
)

# Errors that are the caller's business (logged at debug), not the operator's.
_EXPECTED = (E.NotFound, E.AlreadyExists, E.InvalidInput, E.GenerationConflict)


def errno_of(exc: BaseException, *, creating: bool = False) -> int:
    """The errno a syscall answers for `exc` (see the module docstring for the choices)."""
    if isinstance(exc, pyfuse3.FUSEError):
        return exc.errno
    if isinstance(exc, E.GenerationConflict) and creating:
        return errno.EEXIST
    for kind, number in _TABLE:
        if isinstance(exc, kind):
            return number
    if isinstance(exc, OSError) and exc.errno:
        return exc.errno
    return errno.EIO


def refuse(number: int, why: str) -> pyfuse3.FUSEError:
    """A refusal with a log line that says why (for operations nokvfs does not support)."""
    log.debug("refused (%s): %s", errno.errorcode.get(number, number), why)
    return pyfuse3.FUSEError(number)


@contextlib.contextmanager
def translated(operation: str, *, creating: bool = False):
    """Run a handler body: typed errors become FUSEError, nothing else escapes."""
    try:
        yield
    except pyfuse3.FUSEError:
        raise
    except E.NokvError as exc:
        number = errno_of(exc, creating=creating)
        level = logging.DEBUG if isinstance(exc, _EXPECTED) else logging.WARNING
        log.log(level, "%s: %s: %s -> %s", operation, type(exc).__name__, exc, errno.errorcode.get(number, number))
        raise pyfuse3.FUSEError(number) from None
    except OSError as exc:
        number = exc.errno or errno.EIO
        log.warning("%s: %s -> %s", operation, exc, errno.errorcode.get(number, number))
        raise pyfuse3.FUSEError(number) from None
    except Exception:
        log.exception("%s: unexpected failure -> EIO", operation)
        raise pyfuse3.FUSEError(errno.EIO) from None
