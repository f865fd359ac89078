"""The web servers the CLI starts (`ui`: MLflow's, `dashboard`: optuna-dashboard's): a port that is taken is refused
before anything starts, and a server in a child process lives and dies with the command.

`mlflow ui` is a tree of processes (the CLI, then uvicorn's server and its worker); signalling only its top process
leaves the worker serving the port, and started on a taken port it logs "address already in use" and exits 0. So the
child gets a process group of its own, the command watches the port until the server answers, and Ctrl-C or SIGTERM
stops the whole group.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

from core.errors import UserError

STOP_GRACE = 10.0  # seconds the server's processes get to exit on SIGTERM before they are killed
POLL = 0.2  # seconds between looks at the child and its port


def check_port_free(host: str, port: int) -> None:
    """UserError naming the port if something listens on (host, port). SO_REUSEADDR, as the servers bind: a port
    left in TIME_WAIT by a server stopped a moment ago is free to them, and so here."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            raise UserError(f"cannot serve on {host}:{port}: {exc.strerror} (another server listens there?); pick "
                            f"another with --port") from None


def answers(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=1).close()
        return True
    except OSError:
        return False


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the child's process group, SIGKILL to what is left of it after `STOP_GRACE`."""
    for sig, wait in ((signal.SIGTERM, STOP_GRACE), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:  # the group is gone
            return
        try:
            proc.wait(wait)
        except subprocess.TimeoutExpired:
            continue
        deadline = time.monotonic() + (wait or STOP_GRACE)
        while time.monotonic() < deadline:  # the leader is gone; its children may still be closing the port
            try:
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(POLL)


def serve(cmd: list[str], env: dict[str, str], host: str, port: int, what: str) -> int:
    """Run the server `cmd` in a process group of its own until it exits or the command is stopped (Ctrl-C, or
    SIGTERM, which `cli.main` raises as `Terminated`); either way the whole group is stopped. Returns the server's
    exit code; 1 with one line if it exits before it answered on (host, port)."""
    proc = subprocess.Popen(cmd, env=env, start_new_session=True)
    try:
        served = False
        while (code := proc.poll()) is None:
            served = served or answers(host, port)
            time.sleep(POLL)
    except BaseException:
        _stop(proc)
        raise
    _stop(proc)  # what the leader left behind
    if not served:
        print(f"accelbench: error: {what} exited with code {code} before it served http://{host}:{port} (its output "
              f"is above)", file=sys.stderr)
        return code or 1
    return code
