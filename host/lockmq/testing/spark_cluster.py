"""A Spark standalone cluster on this machine: a master and workers from PySpark's own
``bin/spark-class``, each a separate JVM process on 127.0.0.1 with free ports.

    with SparkCluster(workdir, workers=2) as cluster:
        cluster.submit(["spark/ingest_job.py", "/landing", "--warehouse", "/wh"])

This is how a campus runs Spark (``start-master.sh`` / ``start-worker.sh`` run the same
classes), so the tests and ``bench/bench_spark.py --cluster`` exercise the real
scheduling, executor launch and ``spark-submit`` path instead of ``local[N]``. Every
process gets its own process group and is killed with it (SIGTERM, then SIGKILL), also
when starting fails half-way. Needs ``pyspark`` and Java; :func:`spark_home` and
:func:`java_missing` say what is missing.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import IO, Any

from .ports import free_port
from .waiting import wait_for


def spark_home() -> str:
    """The Spark distribution PySpark ships (its ``bin/spark-class``)."""
    import pyspark

    return os.path.dirname(pyspark.__file__)


def java_missing() -> str | None:
    """Why a cluster cannot start here (no Java, no pyspark), or None."""
    try:
        import pyspark  # noqa: F401
    except ImportError:
        return "pyspark is not installed (pip install 'lockmq[spark]')"
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        return "Spark needs Java (no java on PATH, JAVA_HOME unset)"
    return None


def cluster_env(workdir: str) -> dict[str, str]:
    """Environment for Spark daemons and ``spark-submit``: 127.0.0.1, this venv's Python
    for the executors' Python workers, small daemon heaps, logs under ``workdir``."""
    env = dict(os.environ)
    env.update({
        "SPARK_HOME": spark_home(),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_LOG_DIR": os.path.join(workdir, "logs"),
        "SPARK_DAEMON_MEMORY": "256m",  # the master and worker daemons only schedule
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        # Python workers connect back within this many seconds; a busy machine needs more
        "SPARK_AUTH_SOCKET_TIMEOUT": env.get("SPARK_AUTH_SOCKET_TIMEOUT", "120"),
    })
    env.pop("PYSPARK_GATEWAY_PORT", None)  # not this process's JVM
    env.pop("PYSPARK_GATEWAY_SECRET", None)
    return env


class SparkCluster:
    """A standalone master and ``workers`` workers (``cores`` cores, ``memory`` each).

    ``start()`` returns once every worker has registered with the master (read from
    the master's JSON status page); ``stop()`` kills every process group. Logs of
    each daemon are in ``workdir/<name>.log``.
    """

    def __init__(self, workdir: str | os.PathLike[str], workers: int = 2, cores: int = 1,
                 memory: str = "512m", start_timeout: float = 90.0) -> None:
        self.workdir = str(workdir)
        self.n_workers = workers
        self.cores = cores
        self.memory = memory
        self.start_timeout = start_timeout
        self.port = free_port()
        self.ui_port = free_port()
        self.procs: dict[str, subprocess.Popen[Any]] = {}
        self._logs: list[IO[bytes]] = []
        self.env = cluster_env(self.workdir)

    @property
    def master_url(self) -> str:
        """``spark://127.0.0.1:<port>`` for ``--master``."""
        return f"spark://127.0.0.1:{self.port}"

    def __enter__(self) -> SparkCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _spawn(self, name: str, cls: str, *args: str) -> None:
        log = open(os.path.join(self.workdir, f"{name}.log"), "ab")
        self._logs.append(log)
        cmd = [os.path.join(spark_home(), "bin", "spark-class"), cls, *args]
        # own session = own process group: spark-class execs java, which may fork
        self.procs[name] = subprocess.Popen(cmd, env=self.env, cwd=self.workdir, stdout=log,
                                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            start_new_session=True)

    def status(self) -> dict[str, Any]:
        """The master's JSON status page (workers, applications); {} while it is not up."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json", timeout=2) as r:
                return json.load(r)
        except (OSError, ValueError):
            return {}

    def alive_workers(self) -> int:
        """How many workers the master sees ALIVE."""
        return sum(1 for w in self.status().get("workers", []) if w.get("state") == "ALIVE")

    def _check_running(self) -> None:
        for name, p in self.procs.items():
            if p.poll() is not None:
                raise RuntimeError(f"spark {name} exited with {p.returncode}:\n{self.log(name)[-3000:]}")

    def start(self) -> None:
        """Start the master, then the workers; wait until all have registered."""
        os.makedirs(os.path.join(self.workdir, "logs"), exist_ok=True)
        atexit.register(self.stop)  # JVMs must not outlive an interrupted test run
        try:
            self._spawn("master", "org.apache.spark.deploy.master.Master",
                        "--host", "127.0.0.1", "--port", str(self.port), "--webui-port", str(self.ui_port))
            wait_for(lambda: self._check_running() or self.status(), "the Spark master's status page",
                     timeout=self.start_timeout)
            for i in range(self.n_workers):
                work = os.path.join(self.workdir, f"worker{i}")
                os.makedirs(work, exist_ok=True)
                self._spawn(f"worker{i}", "org.apache.spark.deploy.worker.Worker",
                            "--host", "127.0.0.1", "--webui-port", str(free_port()),
                            "--cores", str(self.cores), "--memory", self.memory,
                            "--work-dir", work, self.master_url)
            wait_for(lambda: self._check_running() or self.alive_workers() >= self.n_workers,
                     f"{self.n_workers} Spark workers to register", timeout=self.start_timeout, interval=0.2)
        except BaseException:
            self.stop()
            raise

    def submit_command(self, args: list[str], executor_memory: str | None = None,
                       conf: dict[str, str] | None = None) -> list[str]:
        """The ``spark-submit`` command line running ``args`` (a .py file and its arguments)
        on this cluster: one executor per worker, all cores, 127.0.0.1, UI off."""
        settings = {"spark.executor.memory": executor_memory or self.memory,
                    "spark.executor.cores": str(self.cores),
                    "spark.cores.max": str(self.cores * self.n_workers),
                    "spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1",
                    "spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false",
                    "spark.pyspark.python": sys.executable,
                    "spark.sql.session.timeZone": "UTC"}
        settings.update(conf or {})
        cmd = [os.path.join(spark_home(), "bin", "spark-submit"), "--master", self.master_url]
        for k, v in settings.items():
            cmd += ["--conf", f"{k}={v}"]
        return cmd + list(args)

    def submit(self, args: list[str], timeout: float = 300.0, **kw: Any) -> subprocess.CompletedProcess[str]:
        """Run ``spark-submit`` on this cluster and wait; raise with its output if it fails."""
        proc = subprocess.Popen(self.submit_command(args, **kw), env=self.env, cwd=self.workdir,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
        try:
            out, err = proc.communicate(timeout=timeout)
        finally:
            _kill_group(proc)
        done = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
        if proc.returncode != 0:
            raise RuntimeError(f"spark-submit failed ({proc.returncode}):\n{out[-2000:]}\n{err[-4000:]}")
        return done

    def log(self, name: str) -> str:
        """The output of daemon ``name`` (``master``, ``worker0`` ...) so far."""
        return Path(self.workdir, f"{name}.log").read_text(errors="replace")

    def stop(self) -> None:
        """Kill the workers, then the master (each whole process group); idempotent."""
        for name in sorted(self.procs, reverse=True):  # workers before the master
            _kill_group(self.procs[name])
        self.procs.clear()
        for f in self._logs:
            f.close()
        self._logs.clear()
        atexit.unregister(self.stop)


def _kill_group(proc: subprocess.Popen[Any], grace: float = 10.0) -> None:
    """SIGTERM the process group of ``proc`` (its leader started a new session), SIGKILL
    it after ``grace`` seconds, and reap the leader."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # stragglers of the group too (executors, Python workers)
    except ProcessLookupError:
        pass
    proc.wait(30)
