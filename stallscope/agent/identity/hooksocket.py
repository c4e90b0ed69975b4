"""The hook socket file: the agent's, in a directory only the agent can write, with the
permissions the deployment sets (0660 and the trainers' group by default), and watched.

Trainers find the agent by the socket's path. If the file could be removed or replaced
by someone else, a process that binds the path first would receive every trainer's
reports: so the directory must not be writable by other users (the agent creates it
0755, and refuses one that others may write to unless it is sticky, like /tmp), and the
agent checks once a second that the path is still its socket, recreating it when it is
gone or replaced (``stallscope_agent_socket_recreated_total``; /healthz fails while it
cannot).
"""
from __future__ import annotations

import dataclasses
import grp
import os
import socket
import stat


class BindError(Exception):
    pass


@dataclasses.dataclass(frozen=True)
class SocketSpec:
    path: str
    # Who may connect: the agent's user and the socket's group (the trainers'). With 0666
    # any process that could reach the directory could connect and hold connections or
    # claim names (issue 33); identity is checked per connection anyway.
    mode: int = 0o660
    group: int | None = None  # chown the socket to this group (with mode 0660, say)


def parse_mode(text: str) -> int:
    try:
        mode = int(text, 8)
    except ValueError:
        raise ValueError("--socket-mode must be an octal mode such as 0660, got %r" % text) from None
    if not 0 <= mode <= 0o777:
        raise ValueError("--socket-mode out of range: %r" % text)
    return mode


def parse_group(text: str) -> int | None:
    if not text:
        return None
    if text.isdigit():
        return int(text)
    try:
        return grp.getgrnam(text).gr_gid
    except KeyError:
        raise ValueError("--socket-group: no group %r on this host" % text) from None


def _check_directory(directory: str) -> None:
    try:
        os.makedirs(directory, mode=0o755, exist_ok=True)
        st = os.stat(directory)
    except OSError as e:
        raise BindError("cannot create %s: %s" % (directory, e.strerror)) from None
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not st.st_mode & stat.S_ISVTX:
        raise BindError("hook socket directory %s is writable by other users: anyone could "
                        "replace the socket (chmod 755 it, or use a directory of the agent's own)"
                        % directory)


def _in_use(path: str) -> bool:
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        probe.connect(path)
        return True
    except OSError:
        return False
    finally:
        probe.close()


class HookSocket:
    def __init__(self, spec: SocketSpec) -> None:
        self.spec = spec
        self.sock: socket.socket | None = None
        self.ident: tuple[int, int] | None = None   # (st_dev, st_ino) of our file
        self.recreated = 0
        self.problem: str | None = None             # why the socket is not serving now

    def bind(self, replace_stale: bool = True) -> socket.socket:
        """Create the listening socket, replacing a stale socket file; BindError if not."""
        path = self.spec.path
        _check_directory(os.path.dirname(os.path.abspath(path)))
        try:
            st: os.stat_result | None = os.lstat(path)
        except FileNotFoundError:
            st = None
        except OSError as e:
            raise BindError("cannot bind hook socket %s: %s" % (path, e.strerror)) from None
        if st is not None:
            if not stat.S_ISSOCK(st.st_mode):
                raise BindError("cannot bind hook socket %s: a non-socket file is in the way" % path)
            if replace_stale and _in_use(path):
                raise BindError("cannot bind hook socket %s: another agent is listening on it" % path)
            os.unlink(path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        try:
            sock.bind(path)
            if self.spec.group is not None:
                os.chown(path, -1, self.spec.group)
            os.chmod(path, self.spec.mode)
            sock.listen(512)
            st = os.lstat(path)
        except OSError as e:
            sock.close()
            raise BindError("cannot bind hook socket %s: %s" % (path, e.strerror)) from None
        sock.setblocking(False)
        self.sock, self.ident, self.problem = sock, (st.st_dev, st.st_ino), None
        return sock

    def intact(self) -> bool:
        """Whether the path is still the socket this agent bound."""
        try:
            st = os.lstat(self.spec.path)
        except OSError:
            return False
        return (st.st_dev, st.st_ino) == self.ident

    def check(self) -> socket.socket | None:
        """Called once a second: a new listening socket when the file was gone or replaced
        and could be recreated (the caller swaps it in and closes the old one), else None."""
        if self.intact():
            return None
        try:
            # Whatever is at the path now is not ours: a remover or a squatter. The
            # directory is the agent's, so it may take the path back.
            try:
                os.unlink(self.spec.path)
            except FileNotFoundError:
                pass
            sock = self.bind(replace_stale=False)
        except (BindError, OSError) as e:
            self.problem = "hook socket %s is gone and cannot be recreated: %s" % (self.spec.path, e)
            return None
        self.recreated += 1
        return sock

    def remove(self) -> None:
        if self.intact():
            try:
                os.unlink(self.spec.path)
            except OSError:
                pass
