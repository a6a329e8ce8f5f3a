"""vramshim: a flight recorder for GPU memory.

The `vramshim` command (also `python -m vramshim`) runs programs under the recorder and reads
the logs; see `vramshim --help`. In a program recorded by it, `mark(text)` writes an
annotation into the log, which reports draw on timelines:

    import vramshim
    for epoch in range(3):
        vramshim.mark(f"epoch {epoch}")
        train_one_epoch()

Outside the recorder `mark` does nothing and returns False.
"""

import ctypes
import os

__all__ = ["mark", "recording", "executable", "library"]

_PACKAGE = os.path.dirname(os.path.abspath(__file__))
_BIN = os.path.join(_PACKAGE, "_bin")

# The recorder's entry point when it is preloaded (looked up once), else None.
_mark_function = None
_looked_up = False


def executable():
    """Path of the bundled `vramshim` command."""
    return os.path.join(_BIN, "vramshim")


def library():
    """Path of the bundled recorder, libvramshim.so (what `vramshim run` preloads)."""
    return os.path.join(_BIN, "libvramshim.so")


def _entry_point():
    global _mark_function, _looked_up
    if not _looked_up:
        _looked_up = True
        try:
            function = ctypes.CDLL(None).vramshim_mark
        except (AttributeError, OSError):
            function = None
        if function is not None:
            function.argtypes = [ctypes.c_char_p]
            function.restype = ctypes.c_int
        _mark_function = function
    return _mark_function


def recording():
    """Whether this process runs under the recorder (libvramshim.so is loaded)."""
    return _entry_point() is not None


def mark(text):
    """Writes `text` into the recording as a mark stamped now; True when it was recorded.

    A no-op returning False when the process is not recorded. Text longer than 4 KiB is cut.
    Not for signal handlers of C code (Python-level signal handlers are fine).
    """
    function = _entry_point()
    if function is None:
        return False
    if isinstance(text, bytes):
        data = text
    else:
        data = str(text).encode("utf-8", "surrogateescape")
    data = data.replace(b"\0", b"\\0")
    return function(data) == 1
