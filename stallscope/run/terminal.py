"""The training's terminal output, relayed through a pseudo-terminal so that the live
view never draws in the middle of it (issue 34: the in-place redraw overwrote torchrun's
banner and the framework's log lines; issue 52: under a progress bar it froze the bar
and added a line a second).

The training still writes to a terminal (progress bars, colours: its ``isatty()`` is
true), one as wide as ours and as high as the region the view leaves it (live.View:
a progress bar sized to it fits); each chunk it writes is copied to ours under the
view's lock, and the view is told when a chunk ends inside an escape sequence (a draw
then would break it). Its stdin stays ours. Used only when our stdout is a terminal;
elsewhere the training inherits it.
"""
import codecs
import fcntl
import os
import pty
import re
import struct
import termios
import threading

DRAIN_S = 2.0  # after the training exits, its last output (a grandchild may hold the pty)
# a complete escape sequence: CSI (parameters, intermediates, final byte), OSC (ended by
# BEL or ST), or a two- or three-byte one (ESC 7, ESC ( B ...)
_COMPLETE = re.compile(r"\x1b(\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(\x07|\x1b\\)|(?![\[\]])[ -/]*[0-~])")
LONGEST_ESCAPE = 256  # an open sequence longer than this is not one: drawing goes on


def open_escape(text):
    """The end of ``text`` from an escape sequence it leaves open, or ''."""
    i = text.rfind("\x1b")
    if i < 0:
        return ""
    tail = text[i:]
    return "" if _COMPLETE.match(tail) or len(tail) > LONGEST_ESCAPE else tail


class Relay:
    def __init__(self, view, stderr_too):
        self.view = view
        self.master, self.slave = pty.openpty()
        self.stderr_too = stderr_too
        try:  # the training's terminal is as wide as ours (line wrapping, tqdm's bar)
            size = fcntl.ioctl(view.out.fileno(), termios.TIOCGWINSZ, b"\0" * 8)
            fcntl.ioctl(self.slave, termios.TIOCSWINSZ, size)
        except (OSError, ValueError, AttributeError):
            pass
        self.thread = threading.Thread(target=self._copy, name="stallscope-relay", daemon=True)
        self.pending = ""  # the training's escape sequence still open at the end of a chunk
        view.on_region = self.resize

    def resize(self, columns, rows):
        """The training's terminal: as wide as ours, as high as the region it scrolls in."""
        if self.master is None:
            return
        try:
            fcntl.ioctl(self.master, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
        except OSError:
            pass

    def popen_kwargs(self):
        kw = {"stdout": self.slave}
        if self.stderr_too:
            kw["stderr"] = self.slave
        return kw

    def started(self):
        """The training has the pty: close our copy of its end, so that reading ours
        ends (EIO) once every process of the training has closed it."""
        os.close(self.slave)
        self.slave = None
        self.thread.start()

    def _copy(self):
        decode = codecs.getincrementaldecoder("utf-8")(errors="replace")
        while True:
            try:
                chunk = os.read(self.master, 65536)
            except OSError:  # EIO: no process holds the training's end any more
                chunk = b""
            if not chunk:
                break
            text = decode.decode(chunk)
            with self.view.lock:
                self.view.out.write(text)
                self.view.out.flush()
                self.pending = open_escape(self.pending + text)
                self.view.open_escape = bool(self.pending)

    def close(self):
        if self.slave is not None:
            os.close(self.slave)
            self.slave = None
        if self.thread.is_alive():
            self.thread.join(DRAIN_S)
        if not self.thread.is_alive() and self.master is not None:
            os.close(self.master)
            self.master = None
