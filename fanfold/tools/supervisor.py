"""The per-call supervisor of the ``bash`` tool: one small process per command.

Run as ``python -I -S supervisor.py STATUS_FD TIMEOUT SHELL -c COMMAND`` by
:mod:`fanfold.tools.bash`; it imports nothing but the standard library (and nothing of
fanfold), so it starts in a few milliseconds.

- On Linux it makes itself a child subreaper (``PR_SET_CHILD_SUBREAPER``): a process the
  command starts that daemonises or calls ``setsid`` is re-parented to the supervisor,
  never to init, so it stays findable as a descendant.
- Its stdin is a pipe whose only writer is fanfold. End-of-file on it means "stop": fanfold
  closed it to cancel the call, or fanfold died (the kernel closes the pipe however the
  process ends, SIGKILL included). ``PR_SET_PDEATHSIG`` is not used: it fires when the
  parent *thread* exits, and Trio starts processes from worker threads that end when idle.
- The command runs as ``SHELL -c COMMAND`` in a new session, stdin at end-of-file, output
  to the supervisor's own stdout and stderr (the pipe fanfold reads).
- When the shell exits, the time limit passes, fanfold says stop, or the supervisor gets
  SIGTERM/SIGINT/SIGHUP, it kills the shell's process group and then, on Linux, every
  descendant it can find in /proc, repeatedly, until none is left; it reaps them all.
- Last it writes one line to ``STATUS_FD``, tab-separated ``key=value`` fields: ``end``
  (exit, timeout, stopped or error), ``code`` or ``signal`` (the shell's), ``killed``,
  ``background`` (killed after the shell exited), ``left`` (could not be killed),
  ``method`` (subreaper or process group) and, for ``end=error``, ``error``. (Not JSON:
  importing ``json`` would double the supervisor's start-up time.)

Serve mode (``--serve LIFELINE_FD STATUS_FD COMMAND...``, for MCP stdio servers): the
command is started directly (no shell), keeps the supervisor's stdin and stdout (the
pipes fanfold speaks the protocol over; the supervisor then points its own at
/dev/null), and has no time limit; the lifeline is the pipe ``LIFELINE_FD``.

On systems without /proc and the subreaper (macOS, the BSDs) only the process group is
killed: a process that leaves the group (``setsid``, a daemon) survives there.
"""

import contextlib
import os
import select
import signal
import sys
import time

PR_SET_CHILD_SUBREAPER = 36


def _subreaper() -> bool:
    """Become a child subreaper (Linux); False where that is not possible."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def _children_map() -> dict[int, list[tuple[int, bool]]]:
    """Parent pid -> [(pid, is_zombie)] for every process in /proc."""
    children: dict[int, list[tuple[int, bool]]] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return children
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue  # ended while we looked
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) < 2:
            continue
        children.setdefault(int(fields[1]), []).append((int(name), fields[0] in (b"Z", b"X")))
    return children


def descendants(root: int) -> list[int]:
    """Live (not zombie) descendants of ``root``, found through /proc (Linux)."""
    tree = _children_map()
    found: list[int] = []
    todo = [root]
    while todo:
        for pid, zombie in tree.get(todo.pop(), ()):
            todo.append(pid)
            if not zombie:
                found.append(pid)
    return found


class Supervisor:
    """Runs one command and kills everything it started when it ends."""

    def __init__(
        self, status_fd: int, timeout: float, argv: list[str], lifeline: int | None = None
    ) -> None:
        self.status_fd = status_fd
        self.timeout = timeout
        self.argv = argv
        # Serve mode (``lifeline`` given): the command is a long-lived server speaking
        # over the supervisor's own stdin and stdout (an MCP stdio server); the
        # lifeline is then a separate pipe.
        self.lifeline = 0 if lifeline is None else lifeline
        self.serve = lifeline is not None
        self.subreaper = _subreaper()
        self.has_proc = os.path.isdir("/proc/self")
        self.shell_status: int | None = None
        self.killed: set[int] = set()

    def reap(self) -> None:
        """Reap every ended child (the shell, and orphans re-parented to us)."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid == self.shell and self.shell_status is None:
                self.shell_status = status

    def run(self) -> dict[str, object]:
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        stop_signals: list[int] = []
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, lambda n, _f: stop_signals.append(n))
        signal.signal(signal.SIGCHLD, lambda _n, _f: None)
        # The command gets end-of-file on stdin (a pipe whose write end is closed), and
        # none of our own descriptors (our stdin is fanfold's lifeline).
        stdin_r, stdin_w = os.pipe()
        os.close(stdin_w)
        os.set_inheritable(self.status_fd, False)
        os.set_inheritable(self.lifeline, False)
        # Serve mode: the server gets our stdin and stdout (fanfold's pipes to it).
        actions = [] if self.serve else [(os.POSIX_SPAWN_DUP2, stdin_r, 0)]
        try:
            self.shell = os.posix_spawnp(
                self.argv[0], self.argv, os.environ, file_actions=actions, setsid=True
            )
        except OSError as e:
            return {"end": "error", "error": f"cannot start {self.argv[0]}: {e.strerror or e}"}
        finally:
            os.close(stdin_r)
        if self.serve:
            # Our copies would keep the server's stdin open after fanfold closes it
            # (no end-of-file for the server) and its stdout open after it exits.
            null = os.open(os.devnull, os.O_RDWR)
            os.dup2(null, 0)
            os.dup2(null, 1)
            os.close(null)
        deadline = time.monotonic() + self.timeout
        end = "exit"
        while True:
            self.reap()
            if self.shell_status is not None:
                break
            if stop_signals:
                end = "stopped"
                break
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                end = "timeout"
                break
            ready, _, _ = select.select([self.lifeline, wake_r], [], [], min(remaining, 3600.0))
            if self.lifeline in ready and not os.read(self.lifeline, 512):
                end = "stopped"  # fanfold closed the lifeline, or died
                break
            if wake_r in ready:
                os.read(wake_r, 512)
        left = self.kill_all(wake_r)
        report: dict[str, object] = {
            "end": end,
            "killed": len(self.killed),
            "left": left,
            "method": "subreaper" if self.subreaper and self.has_proc else "process group",
        }
        status = self.shell_status
        if status is not None and end == "exit":
            report["background"] = len(self.killed)
        if status is not None:
            if os.WIFSIGNALED(status):
                report["signal"] = os.WTERMSIG(status)
            else:
                report["code"] = os.WEXITSTATUS(status)
        return report

    def kill_all(self, wake_r: int) -> int:
        """Kill the shell's group and every descendant until none is left; reap them.
        Returns how many could not be killed (still alive after the last attempt)."""
        me = os.getpid()
        alive: list[int] = []
        for _attempt in range(2000):
            alive = descendants(me) if self.has_proc else []
            for pid in alive:
                try:
                    os.kill(pid, signal.SIGKILL)
                    self.killed.add(pid)
                except ProcessLookupError:
                    pass
                except PermissionError:
                    pass  # a set-uid program: counted in "left" if it stays
            with contextlib.suppress(ProcessLookupError, PermissionError):
                # The shell's pid is still its group's id: it is a zombie at worst
                # (not yet reaped) or the group has members left.
                os.killpg(self.shell, signal.SIGKILL)
            if self.shell_status is None and not self.has_proc:
                self.killed.add(self.shell)
            self.reap()
            if not alive and self.shell_status is not None:
                return 0
            # Let SIGKILL land (and SIGCHLD wake us) before looking again.
            ready, _, _ = select.select([wake_r], [], [], 0.01)
            if ready:
                os.read(wake_r, 512)
        return len(alive)


def main() -> None:
    if sys.argv[1] == "--serve":  # --serve LIFELINE_FD STATUS_FD COMMAND...
        lifeline = int(sys.argv[2])
        status_fd = int(sys.argv[3])
        supervisor = Supervisor(status_fd, float("inf"), sys.argv[4:], lifeline)
    else:
        status_fd = int(sys.argv[1])
        supervisor = Supervisor(status_fd, float(sys.argv[2]), sys.argv[3:])
    report = supervisor.run()
    with os.fdopen(status_fd, "w") as status:
        fields = (f"{key}={str(value).replace(chr(9), ' ')}" for key, value in report.items())
        status.write("\t".join(fields) + "\n")


if __name__ == "__main__":
    main()
