"""The load tools, each in its own process: wrk (closed loop, from Debian's ``wrk`` package)
and ``bench.openloop`` (open loop; also the closed-loop fallback when wrk is absent)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import orjson

from bench.payloads import ROOT

WRK_SCRIPT: Final[str] = """\
-- POST one AdmissionReview (path in BENCH_BODY) on every request; print a JSON summary.
local f = assert(io.open(os.getenv("BENCH_BODY"), "rb"))
wrk.method = "POST"
wrk.body = f:read("*a")
f:close()
wrk.headers["Content-Type"] = "application/json"

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'BENCHJSON {"requests":%d,"duration_us":%d,"bytes":%d,"connect":%d,"read":%d,' ..
    '"write":%d,"status":%d,"timeout":%d,"p50_us":%d,"p99_us":%d,"max_us":%d}\\n',
    summary.requests, summary.duration, summary.bytes, e.connect, e.read, e.write,
    e.status, e.timeout, latency:percentile(50), latency:percentile(99), latency.max))
end
"""


def wrk_path() -> str | None:
    return shutil.which("wrk")


def wrk_version() -> str | None:
    wrk = wrk_path()
    if wrk is None:
        return None
    done = subprocess.run([wrk, "--version"], capture_output=True, text=True, check=False)
    first = (done.stdout or done.stderr).strip().splitlines()
    return first[0].split(" Copyright")[0] if first else "unknown"


@dataclass(frozen=True, slots=True)
class ClosedResult:
    tool: str  # "wrk" or "bench.openloop"
    requests: int
    seconds: float
    errors: int
    rps: float
    latency_ms: dict[str, float]  # closed-loop latency: informative only (not CO-free)

    def to_json(self) -> dict[str, Any]:
        return {
            "tool": self.tool,
            "requests": self.requests,
            "seconds": round(self.seconds, 3),
            "errors": self.errors,
            "rps": round(self.rps, 1),
            "latency_ms": {k: round(v, 3) for k, v in self.latency_ms.items()},
        }


def _pin(cpu: int | None) -> list[str]:
    taskset = shutil.which("taskset")
    if cpu is None or taskset is None:
        return []
    return [taskset, "-c", str(cpu)]


def run_wrk(
    port: int,
    body_file: Path,
    seconds: int,
    connections: int,
    cpu: int | None,
    connection_close: bool = False,
) -> ClosedResult:
    wrk = wrk_path()
    if wrk is None:
        raise RuntimeError("wrk is not installed")
    with tempfile.TemporaryDirectory(prefix="bench-wrk-") as tmp:
        script = Path(tmp) / "post.lua"
        script.write_text(WRK_SCRIPT)
        args = [
            *_pin(cpu),
            wrk,
            "-t1",  # one thread: the load generator gets one core, the server the other
            f"-c{connections}",
            f"-d{max(1, seconds)}s",
            "--timeout",
            "5s",
            "-s",
            str(script),
        ]
        if connection_close:
            args += ["-H", "Connection: close"]
        args.append(f"https://127.0.0.1:{port}/mutate")
        env = {**os.environ, "BENCH_BODY": str(body_file)}
        done = subprocess.run(
            args, capture_output=True, text=True, env=env, timeout=seconds + 60, check=False
        )
    for line in done.stdout.splitlines():
        if line.startswith("BENCHJSON "):
            data = orjson.loads(line[len("BENCHJSON ") :])
            break
    else:
        raise RuntimeError(f"wrk gave no summary (exit {done.returncode}): {done.stderr.strip()}")
    elapsed = data["duration_us"] / 1e6
    errors = sum(data[k] for k in ("connect", "read", "write", "status", "timeout"))
    return ClosedResult(
        tool="wrk",
        requests=data["requests"],
        seconds=elapsed,
        errors=errors,
        rps=data["requests"] / elapsed,
        latency_ms={
            "p50": data["p50_us"] / 1e3,
            "p99": data["p99_us"] / 1e3,
            "max": data["max_us"] / 1e3,
        },
    )


def run_openloop(
    port: int,
    body_file: Path,
    *,
    cpu: int | None,
    rate: float = 1000.0,
    seconds: float = 10.0,
    warmup: float = 1.0,
    connections: int = 64,
    closed: bool = False,
    connection_close: bool = False,
    ca_file: Path | None = None,
) -> dict[str, Any]:
    """``bench.openloop`` in its own process; its JSON result."""
    args = [
        sys.executable,
        "-m",
        "bench.openloop",
        "--port",
        str(port),
        "--body",
        str(body_file),
        "--rate",
        str(rate),
        "--duration",
        str(seconds),
        "--warmup",
        str(warmup),
        "--connections",
        str(connections),
    ]
    if cpu is not None:
        args += ["--cpu", str(cpu)]
    if closed:
        args.append("--closed")
    if connection_close:
        args.append("--connection-close")
    if ca_file is not None:
        args += ["--ca", str(ca_file)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        args, capture_output=True, env=env, cwd=ROOT, timeout=seconds + warmup + 90, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"bench.openloop failed: {done.stderr.decode(errors='replace')[-2000:]}")
    result: dict[str, Any] = orjson.loads(done.stdout)
    return result


def run_closed(
    port: int,
    body_file: Path,
    seconds: int,
    connections: int,
    cpu: int | None,
    *,
    use_wrk: bool,
    connection_close: bool = False,
) -> ClosedResult:
    """Max throughput: wrk when there is one, else the project's own generator."""
    if use_wrk:
        return run_wrk(port, body_file, seconds, connections, cpu, connection_close)
    data = run_openloop(
        port,
        body_file,
        cpu=cpu,
        seconds=seconds,
        warmup=0.5,
        connections=connections,
        closed=True,
        connection_close=connection_close,
    )
    return ClosedResult(
        tool="bench.openloop",
        requests=data["ok"],
        seconds=data["duration_s"],
        errors=data["errors"],
        rps=data["achieved_rps"],
        latency_ms=data["latency_ms"],
    )
