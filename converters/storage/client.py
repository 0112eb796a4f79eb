"""The native object-store client library (obstore) as this process may use it.

obstore runs every request on a tokio runtime that starts on the library's first use, and
tokio does not survive ``fork``: a process forked after its parent made a request inherits
the runtime without its threads, and every request in the child waits forever, through an
inherited client or a new one. That is what a PyTorch DataLoader does on Linux: its worker
processes are forked after ``open_store`` listed the store and read its footers.

So a process forked from one that used the library makes every request through a private
copy of obstore's native module (copied to a new file, so that the dynamic loader maps it
afresh: its own statics, its own runtime, started in the process that first calls it). The
copy's file is deleted once loaded. The parent loads that copy just before its first fork,
and never calls it: each child finds it untouched and makes it its own. Loading code in the
child instead would take the dynamic loader's locks, which another thread of the parent may
have held at the fork (an exception being unwound, a library being loaded), and wait forever.
A child whose parent could not load the copy loads one itself. Every other process (the one
that opened the store, spawn and forkserver workers, a fork taken before any request) uses
obstore as installed. Nothing from the parent's library is called or freed in the child: its
objects are frozen for the garbage collector at the fork (``_before_fork``), so that garbage the
parent had not yet collected is never collected, and its runtime called, in the child.

``library()`` is the module to call (``get``, ``get_range``, ``head``, ``list``,
``list_with_delimiter``, ``put``, ``delete``, and the store classes ``AzureStore``,
``S3Store``, ``GCSStore``); ``errors.<Name>`` is the tuple of that exception class in every
copy this process loaded, for ``except`` clauses.
"""
from __future__ import annotations

import gc
import importlib.machinery
import importlib.util
import os
import shutil
import tempfile
import threading
from types import ModuleType, SimpleNamespace

import obstore
from obstore import _obstore

from trainfeed.converters.errors import TrainfeedError
from trainfeed.converters.storage.cache import pid_alive

_CALLS = ("get", "get_range", "head", "list", "list_with_delimiter", "put", "delete")


def _library(module: ModuleType, stores: ModuleType, origin: str) -> SimpleNamespace:
    """What this module calls of one loaded copy of obstore: ``module``'s functions and
    exceptions, and the store classes of ``stores``."""
    return SimpleNamespace(**{name: getattr(module, name) for name in _CALLS},
                           AzureStore=stores.AzureStore, S3Store=stores.S3Store, GCSStore=stores.GCSStore,
                           exceptions=module.exceptions, origin=origin)


_INSTALLED = _library(_obstore, obstore.store, "installed")

#: The process that first used the installed library (its runtime belongs to that process).
_installed_user: int | None = None
#: (pid, library) of the private copy this process uses, if it needed one.
_private: tuple[int, SimpleNamespace] | None = None
#: A copy loaded before a fork and never called in this process: the next forked child's.
_spare: SimpleNamespace | None = None
_loaded: list[SimpleNamespace] = [_INSTALLED]
_lock = threading.Lock()
#: Whether ``_before_fork`` froze the garbage collector's objects for the fork under way.
_frozen = False


def library() -> SimpleNamespace:
    """The obstore functions and store classes that work in this process."""
    global _installed_user, _private, _spare
    pid = os.getpid()
    if _installed_user in (None, pid):
        _installed_user = pid
        return _INSTALLED
    private = _private
    if private is not None and private[0] == pid:
        return private[1]
    with _lock:
        if _private is None or _private[0] != pid:
            if _spare is not None:  # loaded by the parent, never called there
                _private, _spare = (pid, _spare), None
            else:
                _private = (pid, _load_copy())
                _loaded.append(_private[1])
        return _private[1]


def _in_use_here() -> bool:
    pid = os.getpid()
    return _installed_user == pid or (_private is not None and _private[0] == pid)


#: A private copy's folder: ``trainfeed-obstore-<pid>-<random>``, removed once the copy is loaded.
_COPY_PREFIX = "trainfeed-obstore-"


def _sweep_copies(parent: str) -> None:
    """Remove the copies' folders that processes killed while loading one left in ``parent``
    (their pid, in the name, is gone)."""
    try:
        names = os.listdir(parent)
    except OSError:
        return
    for name in names:
        pid = name[len(_COPY_PREFIX):].split("-", 1)[0]
        if name.startswith(_COPY_PREFIX) and pid.isdigit() and not pid_alive(int(pid)):
            shutil.rmtree(os.path.join(parent, name), ignore_errors=True)


def _load_copy() -> SimpleNamespace:
    """obstore's native module loaded again from a fresh copy of its file, in the first of the
    temporary folder, ``~/.cache/trainfeed`` and ``/dev/shm`` that allows it (a folder mounted
    ``noexec`` cannot load code)."""
    tried = []
    for parent in (None, os.path.expanduser("~/.cache/trainfeed"), "/dev/shm"):
        try:
            if parent:
                os.makedirs(parent, exist_ok=True)
            _sweep_copies(parent or tempfile.gettempdir())
            folder = tempfile.mkdtemp(prefix=f"{_COPY_PREFIX}{os.getpid()}-", dir=parent)
        except OSError as exc:
            tried.append(f"{parent}: {exc.strerror}")
            continue
        try:
            copy = os.path.join(folder, os.path.basename(_obstore.__file__))
            shutil.copyfile(_obstore.__file__, copy)
            loader = importlib.machinery.ExtensionFileLoader(_obstore.__name__, copy)
            spec = importlib.util.spec_from_file_location(_obstore.__name__, copy, loader=loader)
            assert spec is not None  # None only when no loader is known for the path; one is given
            module = importlib.util.module_from_spec(spec)
            loader.exec_module(module)
            break
        except (OSError, ImportError) as exc:
            tried.append(f"{folder}: {exc}")
        finally:
            shutil.rmtree(folder, ignore_errors=True)  # the mapping outlives the file
    else:
        raise TrainfeedError("this process was forked from one that used the object-store client, which cannot "
                             "be used after fork, and no private copy could be loaded (" + "; ".join(tried)
                             + "): start worker processes with 'forkserver' or 'spawn' (DataLoader's "
                             "multiprocessing_context=)")
    return _library(module, module._store, "private copy")


class _Errors:
    """``errors.PreconditionError``: that class of every library loaded here, as a tuple."""

    def __getattr__(self, name: str) -> tuple[type[Exception], ...]:
        return tuple(getattr(lib.exceptions, name) for lib in list(_loaded))


errors = _Errors()


def _before_fork() -> None:
    """A process that made requests freezes its objects for the garbage collector and loads the
    copy its forked children will use (once: every child of this process takes the same
    untouched copy).

    Frozen: garbage not yet collected at the fork (a reference cycle holding a store or a
    response of this process's library) would otherwise be collected in the child, at any
    allocation, even inside another library's fork hook, and freeing it calls into the runtime
    the child inherited without its threads: a child hung that way. The parent unfreezes right
    after the fork (its collector frees that garbage, safely, in the parent); a child keeps the
    inherited objects frozen, as CPython's ``gc.freeze`` documentation advises for forked workers."""
    global _spare, _frozen
    if not _in_use_here():
        return
    gc.freeze()
    _frozen = True
    if _spare is not None:
        return
    with _lock:
        if _spare is None:
            try:
                _spare = _load_copy()
            except TrainfeedError:
                return  # the child tries again, and says why it cannot
            _loaded.append(_spare)


def _after_fork_in_parent() -> None:
    global _frozen
    if _frozen:
        _frozen = False
        gc.unfreeze()


def _after_fork_in_child() -> None:
    global _lock, _frozen
    _lock = threading.Lock()  # a thread of the parent may have held it
    _frozen = False  # what the parent froze stays frozen here


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent, after_in_child=_after_fork_in_child)
