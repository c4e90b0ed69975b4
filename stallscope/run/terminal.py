"""The training's terminal output, relayed through a pseudo-terminal so that the live
view knows when something else was written since its last draw (issue 34: the in-place
redraw moved the cursor up by its own line count and overwrote torchrun's banner and the
framework's log lines printed in between).

The training still writes to a terminal (progress bars, colours: its ``isatty()`` is
true), one with our terminal's size; each chunk it writes is copied to ours under the
view's lock and marks the view dirty, so the next draw appends below it. Its stdin stays
ours. Used only when our stdout is a terminal; elsewhere the training inherits it.
"""
import codecs
import fcntl
import os
import pty
import termios
import threading

DRAIN_S = 2.0  # after the training exits, its last output (a grandchild may hold the pty)


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
                self.view.dirty = True
                self.view.mid_line = not text.endswith("\n")

    def close(self):
        if self.slave is not None:
            os.close(self.slave)
            self.slave = None
        if self.thread.is_alive():
            self.thread.join(DRAIN_S)
        if not self.thread.is_alive():
            os.close(self.master)
