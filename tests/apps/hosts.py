"""Simulated hosts for scale-out tests: one Linux network namespace per "host".

Each host gets its own network stack (its own loopback, no route to the test machine's
127.0.0.1) and reaches Postgres the way a worker on another machine would: over a network
link (a veth pair) to an address that relays to the server. The relay is ``socat``, one per
host, bound to the host-side address of that host's link only. Each process is also started in
its own UTS namespace with its own hostname, so ``worker_id`` names the host it ran on.

Needs root, ``ip`` (iproute2), ``unshare``, ``setpriv`` and ``socat``; :func:`unavailable` says
why not. Cleanup: on exit, on Ctrl-C and on SIGTERM (turned into KeyboardInterrupt while the
hosts exist) everything is removed; relays and the processes started in a host get SIGKILL
when the test process dies (``setpriv --pdeathsig``); namespaces left by a test process that
was killed outright (its pid is in their names) are removed by the next run.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from psycopg.conninfo import conninfo_to_dict, make_conninfo


def unavailable() -> str | None:
    """Why network namespaces cannot be used here, or None when they can."""
    for tool in ("ip", "unshare", "setpriv", "socat"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    name = f"pgqprobe{secrets.token_hex(3)}"
    probe = subprocess.run(
        ["ip", "netns", "add", name], check=False, capture_output=True, text=True
    )
    if probe.returncode != 0:
        return f"cannot create a network namespace: {probe.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", name], check=False, capture_output=True)
    return None


@dataclass
class Host:
    """One simulated host: its namespace, hostname, and the DSN that reaches the server."""

    netns: str
    hostname: str
    dsn: str

    def argv(self, command: Sequence[str]) -> list[str]:
        """``command`` run inside this host (its network and hostname); the process keeps the
        pid it is started with (``ip netns exec`` and ``unshare`` exec, ``sh`` execs)."""
        return [
            *_DIE_WITH_PARENT,
            "ip",
            "netns",
            "exec",
            self.netns,
            "unshare",
            "--uts",
            "sh",
            "-c",
            'hostname "$0" && exec "$@"',
            self.hostname,
            *command,
        ]


@dataclass
class Hosts:
    """Hosts created by :func:`simulated_hosts`."""

    hosts: list[Host] = field(default_factory=list)
    relays: list[subprocess.Popen[bytes]] = field(default_factory=list)


#: Prefix: the process gets SIGKILL when the test process that started it dies.
_DIE_WITH_PARENT = ("setpriv", "--pdeathsig", "KILL")
_NETNS = re.compile(r"^pgq-(\d+)-")


def _run(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True)


def _sweep_stale_namespaces() -> None:
    """Remove the namespaces of test processes that no longer exist (killed outright)."""
    listed = subprocess.run(["ip", "netns", "list"], check=False, capture_output=True, text=True)
    for line in listed.stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        match = _NETNS.match(name)
        if match is None:
            continue
        try:
            os.kill(int(match[1]), 0)
        except ProcessLookupError:
            subprocess.run(["ip", "netns", "del", name], check=False, capture_output=True)
        except PermissionError:
            pass  # alive, another user's


def _free_net() -> int:
    """A second octet N in 100..199 with no 10.N.x.x address on this machine."""
    shown = subprocess.run(["ip", "-o", "-4", "addr", "show"], check=True, capture_output=True)
    used = {int(m) for m in re.findall(rb"inet 10\.(\d+)\.", shown.stdout)}
    free = [n for n in range(100, 200) if n not in used]
    if not free:
        raise RuntimeError("no free 10.N.0.0/16 network for simulated hosts")
    return secrets.choice(free)


@contextlib.contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """SIGTERM raises KeyboardInterrupt meanwhile (so that cleanup runs), in the main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(_signum: int, _frame: object) -> None:
        raise KeyboardInterrupt("SIGTERM")

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _server_target(dsn: str) -> tuple[str, dict[str, str]]:
    """socat's address of the server the DSN names, and the DSN's other parameters."""
    params = {k: str(v) for k, v in conninfo_to_dict(dsn).items() if v is not None}
    host = params.pop("host", "127.0.0.1")
    port = params.pop("port", "5432")
    params.pop("hostaddr", None)
    if host.startswith("/"):
        return f"UNIX-CONNECT:{Path(host) / f'.s.PGSQL.{port}'}", params
    return f"TCP:{host}:{port}", params


def _wait_listening(address: str, port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((address, port), timeout=0.5):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


@contextlib.contextmanager
def simulated_hosts(dsn: str, count: int, log_dir: Path) -> Iterator[Hosts]:
    """``count`` hosts, each with a DSN that reaches the server of ``dsn`` over its own link.

    Addresses are 10.N.<i>.0/24 (host side .1, namespace side .2) with N not in use here, on a
    random port; names carry this process's pid and a random tag, so runs may overlap. A setup
    that loses a race for its addresses (its relay cannot bind) is retried with others.
    Everything is removed on exit (deleting a namespace deletes its veth pair).
    """
    target, params = _server_target(dsn)
    log_dir.mkdir(parents=True, exist_ok=True)
    _sweep_stale_namespaces()
    with _sigterm_interrupts():
        for attempt in range(3):
            made = Hosts()
            namespaces: list[str] = []
            try:
                try:
                    _build(made, namespaces, target, params, count, log_dir)
                except _AddressTaken:
                    if attempt == 2:
                        raise
                    continue
                yield made
                return
            finally:
                for relay in made.relays:
                    relay.kill()
                    relay.wait()
                for ns in namespaces:
                    subprocess.run(["ip", "netns", "del", ns], check=False, capture_output=True)


class _AddressTaken(RuntimeError):
    """A relay could not bind its address: another run took the same one meanwhile."""


def _build(
    made: Hosts,
    namespaces: list[str],
    target: str,
    params: dict[str, str],
    count: int,
    log_dir: Path,
) -> None:
    tag = secrets.token_hex(3)
    net = _free_net()
    port = 15000 + secrets.randbelow(5000)
    for i in range(count):
        ns, outside, inside = f"pgq-{os.getpid()}-{tag}-h{i}", f"pq{tag}o{i}", f"pq{tag}i{i}"
        host_ip, ns_ip = f"10.{net}.{i}.1", f"10.{net}.{i}.2"
        _run("ip", "netns", "add", ns)
        namespaces.append(ns)
        _run("ip", "link", "add", outside, "type", "veth", "peer", "name", inside)
        _run("ip", "link", "set", inside, "netns", ns)
        _run("ip", "addr", "add", f"{host_ip}/24", "dev", outside)
        _run("ip", "link", "set", outside, "up")
        _run("ip", "netns", "exec", ns, "ip", "addr", "add", f"{ns_ip}/24", "dev", inside)
        _run("ip", "netns", "exec", ns, "ip", "link", "set", inside, "up")
        _run("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
        with (log_dir / f"relay{i}.err").open("wb") as err:
            relay = subprocess.Popen(
                [
                    *_DIE_WITH_PARENT,
                    "socat",
                    f"TCP-LISTEN:{port},bind={host_ip},fork,reuseaddr",
                    target,
                ],
                stdout=subprocess.DEVNULL,
                stderr=err,
            )
        made.relays.append(relay)
        _wait_listening(host_ip, port)
        time.sleep(0.1)  # a relay that could not bind exits at once
        if relay.poll() is not None:
            raise _AddressTaken(f"relay on {host_ip}:{port} exited ({relay.returncode})")
        made.hosts.append(
            Host(
                netns=ns,
                hostname=f"host-{i}",
                dsn=make_conninfo(**params, host=host_ip, port=str(port)),
            )
        )
