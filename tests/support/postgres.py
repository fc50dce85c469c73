"""A throwaway PostgreSQL server for the tests: a new cluster in a temporary folder, on a free
port of localhost (and a unix socket in that folder), stopped and removed at the end.

PostgreSQL refuses to run as root: as root, the cluster belongs to an unprivileged user (the
``postgres`` user of Debian's package, else ``nobody``) and its programs run as that user.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import uuid
from pathlib import Path
from typing import Iterator

from support.servers import free_port

USER = "openai_ext"   # the cluster's superuser (trust authentication: any password is accepted)


def binaries() -> Path | None:
    """The folder of initdb and pg_ctl: on the PATH, or Debian's /usr/lib/postgresql/N/bin."""
    found = shutil.which("pg_ctl")
    if found and shutil.which("initdb"):
        return Path(found).parent
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"), key=lambda p: int(p.split("/")[4]))
    return Path(versions[-1]).parent if versions else None


def _runner() -> tuple[list[str], pwd.struct_passwd | None]:
    if os.geteuid() != 0:
        return [], None
    for name in ("postgres", "nobody"):
        try:
            account = pwd.getpwnam(name)
        except KeyError:
            continue
        return ["runuser", "-u", name, "--"], account
    raise RuntimeError("running as root, and there is neither a postgres nor a nobody user to run PostgreSQL as")


class PostgresServer:
    def __init__(self, bin_dir: Path):
        self.bin = bin_dir
        self.prefix, account = _runner()
        self.folder = Path(tempfile.mkdtemp(prefix="openai-ext-pg-"))
        if account is not None:
            os.chown(self.folder, account.pw_uid, account.pw_gid)
        self.data = self.folder / "data"
        self.port = free_port()
        self.started = False

    def _call(self, *argv: str) -> None:
        done = subprocess.run([*self.prefix, *argv], capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"{argv[0]} failed ({done.returncode}): {done.stdout}{done.stderr}")

    def start(self) -> "PostgresServer":
        self._call(str(self.bin / "initdb"), "-D", str(self.data), "-U", USER, "--auth=trust", "-E", "UTF8",
                   "--no-sync")
        self.launch()
        return self

    def launch(self) -> None:
        """Starts the cluster (again, after ``halt``), on the same port and data."""
        options = f"-p {self.port} -k {self.folder} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200"
        self._call(str(self.bin / "pg_ctl"), "-D", str(self.data), "-o", options, "-l", str(self.folder / "log"),
                   "-w", "-t", "60", "start")
        self.started = True

    def halt(self) -> None:
        """Stops the cluster at once, as a crash or an operator would (its data is kept)."""
        self._call(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop")
        self.started = False

    def _processes(self) -> list[int]:
        """The postmaster and its children (the backends serving connections)."""
        postmaster = int((self.data / "postmaster.pid").read_text().split()[0])
        children = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == postmaster:
                children.append(int(stat.parent.name))
        return [postmaster, *children]

    def freeze(self) -> None:
        """Stops every process of the cluster (SIGSTOP): its port still accepts connections and
        its kernel still acknowledges every packet, but nothing ever answers."""
        for pid in self._processes():
            with contextlib.suppress(ProcessLookupError):   # a backend that ended since it was listed
                os.kill(pid, signal.SIGSTOP)

    def thaw(self) -> None:
        for pid in reversed(self._processes()):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)

    def url(self, database: str = "postgres", password: str = "") -> str:
        secret = f":{password}" if password else ""
        return f"postgresql://{USER}{secret}@127.0.0.1:{self.port}/{database}"

    def new_database(self) -> str:
        """A fresh, empty database; its name."""
        import psycopg

        name = f"t_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.url(), autocommit=True, connect_timeout=10) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return name

    def stop(self) -> None:
        if self.started:
            try:
                self.thaw()   # a test that failed while it was frozen
            except (OSError, ValueError):
                pass
            try:
                self._call(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop")
            finally:
                self.started = False
        shutil.rmtree(self.folder, ignore_errors=True)


def started() -> "Iterator[PostgresServer]":
    """A server of its own for a fixture: started, yielded, stopped and removed at the end; the
    test is skipped, with the reason, where PostgreSQL or its driver is not installed."""
    import pytest

    pytest.importorskip("psycopg", reason="psycopg is not installed (pip install -r requirements-dev.txt)")
    found = binaries()
    if found is None:
        pytest.skip("PostgreSQL is not installed (initdb and pg_ctl not found; Debian: apt-get install postgresql)")
    server = PostgresServer(found)
    try:
        server.start()
    except BaseException:
        server.stop()
        raise
    yield server
    server.stop()
