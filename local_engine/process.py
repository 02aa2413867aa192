"""An engine's operating-system process: started in its own process group, logging to
a file, stopped with terminate → kill → join.

    process = EngineProcess(config)      # config already loaded
    process.start()
    process.is_alive()
    process.stop(timeout_s=30)           # SIGTERM to the group, SIGKILL after the timeout

vLLM spawns worker processes (one per GPU, the engine core); signalling the whole group
reaches them, and a final SIGKILL to the group clears any the leader left behind, so a
restarted engine finds its GPUs free.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time

from local_engine.config import EngineConfig
from local_engine.errors import EngineStartError
from local_engine.state import pid_alive

log = logging.getLogger(__name__)

POLL_S = 0.05


class EngineProcess:
    """A started-once wrapper around `subprocess.Popen` for one engine run."""

    def __init__(self, config: EngineConfig) -> None:
        if not config.loaded:
            raise RuntimeError(f"engine '{config.name}': config.load() must run first")
        self.config = config
        self._popen: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        config = self.config
        with config.log_path.open("ab") as log_file:
            stamp = time.strftime("%Y-%m-%d %H:%M:%S")
            log_file.write(f"--- {stamp} starting: {' '.join(config.argv)}\n".encode())
            log_file.flush()
            try:
                self._popen = subprocess.Popen(
                    config.argv,
                    env=config.env,
                    stdin=subprocess.DEVNULL,
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # own session and process group
                )
            except OSError as exc:
                raise EngineStartError(
                    f"engine '{config.name}': cannot run {config.argv[0]!r}: {exc.strerror}"
                ) from exc
        log.info("engine %s started, pid %d", config.name, self._popen.pid)

    @property
    def pid(self) -> int | None:
        return None if self._popen is None else self._popen.pid

    @property
    def returncode(self) -> int | None:
        return None if self._popen is None else self._popen.poll()

    def is_alive(self) -> bool:
        return self._popen is not None and self._popen.poll() is None

    def terminate(self) -> None:
        self._signal_group(signal.SIGTERM)

    def kill(self) -> None:
        self._signal_group(signal.SIGKILL)

    def join(self, timeout_s: float | None = None) -> bool:
        """Wait for the leader to exit; False when it is still running after `timeout_s`."""
        if self._popen is None:
            return True
        try:
            self._popen.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return False
        return True

    def stop(self, timeout_s: float) -> None:
        """Graceful stop with a time limit, then whatever is left of the group is killed."""
        if self.is_alive():
            self.terminate()
            if not self.join(timeout_s) and timeout_s > 0:
                log.warning(
                    "engine %s ignored SIGTERM for %.0fs; killing", self.config.name, timeout_s
                )
        self.kill()
        self.join()

    def _signal_group(self, signum: signal.Signals) -> None:
        if self._popen is not None:
            signal_group(self._popen.pid, signum)


def signal_group(pgid: int, signum: int) -> bool:
    """Send `signum` to a process group; False when the group no longer exists."""
    try:
        os.killpg(pgid, signum)
    except ProcessLookupError:
        return False
    return True


def stop_group(pgid: int, timeout_s: float) -> bool:
    """Stop a group this process did not start (another supervisor's, now dead):
    SIGTERM, wait for its leader to exit, at most `timeout_s`, then SIGKILL the group.
    True if the group was running.
    """
    if not signal_group(pgid, signal.SIGTERM):
        return False
    deadline = time.monotonic() + timeout_s
    while pid_alive(pgid) and time.monotonic() < deadline:  # the leader is the engine
        time.sleep(POLL_S)
    signal_group(pgid, signal.SIGKILL)  # whatever the leader left behind, or the leader
    return True
