"""`netra bench hostile`: the serving path probed as a hostile client would probe it (issue 24).

Against a real launch (by default a fresh `local` one): bad inputs of every kind, the 561-byte
"freeze" request beside a small one, a 50 MB body, the two-client rid race, C concurrent streams
past the front's capacity, repeated loads (memory), and SIGSTOP of an engine and of a response
layer. Every probe speaks raw HTTP/1.1 over asyncio sockets, so a reset, a close before the status
line and a timeout are told apart from any status; `tests/deploy/test_hostile_local.py` asserts
on the same probes. The tool prints the figures and writes `hostile-local-<date>.json` (under
`$NETRA_RUN_DIR/records`, or `--results-dir results/serving` to keep it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from netra import settings
from netra.records import git_sha, host_device, utc_now, write_record
from netra.resources import SOURCE_ROOT

MODEL = "netra-tiny"


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()
FREEZE = {"model": MODEL, "prompt": ["a"] * 100, "n": 64, "max_tokens": 8}


@dataclass
class Reply:
    status: int | None  # None: the connection ended before a status line
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    error: str | None = None  # reset | closed | timeout | <exception name>
    seconds: float = 0.0

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def error_object(self) -> dict[str, Any] | None:
        """The OpenAI error object of a JSON error reply, None when the body is not one."""
        try:
            err = self.json().get("error")
        except (ValueError, AttributeError):
            return None
        ok = isinstance(err, dict) and {"message", "type", "param", "code"} <= set(err)
        return err if ok else None


def request_bytes(method: str, path: str, body: bytes | None = None, *, content_type: str | None = "application/json",
                  extra: str = "", chunked: bool = False) -> bytes:
    head = f"{method} {path} HTTP/1.1\r\nHost: netra\r\nConnection: close\r\n{extra}"
    if body is not None:
        if content_type:
            head += f"Content-Type: {content_type}\r\n"
        head += "Transfer-Encoding: chunked\r\n" if chunked else f"Content-Length: {len(body)}\r\n"
    return (head + "\r\n").encode() + (body or b"")


async def _read_body(reader: asyncio.StreamReader, headers: dict[str, str]) -> bytes:
    if headers.get("transfer-encoding", "").lower() == "chunked":
        out = bytearray()
        while True:
            size = int((await reader.readline()).split(b";")[0].strip() or b"0", 16)
            if size == 0:
                await reader.readline()
                return bytes(out)
            out += await reader.readexactly(size)
            await reader.readline()
    if "content-length" in headers:
        return await reader.readexactly(int(headers["content-length"]))
    return await reader.read()


async def send(url: str, data: bytes | Callable[[asyncio.StreamWriter], Any], timeout: float = 60.0) -> Reply:
    """One request on a fresh connection; `data` is the raw request, or a coroutine function that
    writes it (for bodies sent while the reply is read)."""
    host, port = url.removeprefix("http://").split("/")[0].rsplit(":", 1)
    t0 = time.perf_counter()
    writer: asyncio.StreamWriter | None = None
    sender: asyncio.Task[Any] | None = None
    try:
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_connection(host, int(port), limit=1 << 20)
            if isinstance(data, bytes):
                writer.write(data)
                await writer.drain()
            else:
                sender = asyncio.ensure_future(data(writer))
            line = await reader.readline()
            if not line:
                return Reply(None, error="closed", seconds=time.perf_counter() - t0)
            status = int(line.split()[1])
            seconds = time.perf_counter() - t0
            headers: dict[str, str] = {}
            while (h := await reader.readline()) not in (b"\r\n", b"\n", b""):
                k, _, v = h.decode("latin-1").partition(":")
                headers[k.strip().lower()] = v.strip()
            body = await _read_body(reader, headers)
            return Reply(status, headers, body, seconds=seconds)
    except TimeoutError:
        return Reply(None, error="timeout", seconds=time.perf_counter() - t0)
    except (ConnectionResetError, BrokenPipeError):
        return Reply(None, error="reset", seconds=time.perf_counter() - t0)
    except asyncio.IncompleteReadError:
        return Reply(None, error="closed", seconds=time.perf_counter() - t0)
    except OSError as exc:
        return Reply(None, error=type(exc).__name__, seconds=time.perf_counter() - t0)
    finally:
        if sender is not None:
            sender.cancel()
        if writer is not None:
            writer.close()


def post(url: str, path: str, obj: Any, timeout: float = 60.0) -> Reply:
    return asyncio.run(send(url, request_bytes("POST", path, _dumps(obj)), timeout))


# --- bad inputs -------------------------------------------------------------------------------------

def bad_inputs() -> list[tuple[str, bytes]]:
    """(name, raw request): each must get a 4xx with an OpenAI error object, and nothing else break."""
    chat = "/v1/chat/completions"
    comp = "/v1/completions"
    msgs = [{"role": "user", "content": "hi"}]

    def j(path: str, obj: Any, **kw: Any) -> bytes:
        return request_bytes("POST", path, _dumps(obj), **kw)

    return [
        ("malformed JSON", request_bytes("POST", chat, b"{not json")),
        ("JSON array body", request_bytes("POST", chat, b"[1, 2]")),
        ("no messages", j(chat, {"model": MODEL})),
        ("empty messages", j(chat, {"model": MODEL, "messages": []})),
        ("bad role", j(chat, {"model": MODEL, "messages": [{"role": "wizard", "content": "x"}]})),
        ("negative max_tokens", j(chat, {"model": MODEL, "messages": msgs, "max_tokens": -1})),
        ("string max_tokens", j(comp, {"model": MODEL, "prompt": "x", "max_tokens": "16"})),
        ("string stream", j(comp, {"model": MODEL, "prompt": "x", "stream": "yes"})),
        ("float n", j(comp, {"model": MODEL, "prompt": "x", "n": 2.0})),
        ("negative temperature", j(comp, {"model": MODEL, "prompt": "x", "temperature": -1})),
        ("n = 0", j(comp, {"model": MODEL, "prompt": "x", "n": 0})),
        ("unknown model", j(chat, {"model": "gpt-4o", "messages": msgs})),
        ("text/plain body", request_bytes("POST", chat, _dumps({"model": MODEL, "messages": msgs}),
                                          content_type="text/plain")),
        ("no content type", request_bytes("POST", comp, _dumps({"model": MODEL, "prompt": "x"}),
                                          content_type=None)),
        ("form body", request_bytes("POST", comp, b"model=netra-tiny&prompt=x",
                                    content_type="application/x-www-form-urlencoded")),
        ("freeze request (prompts x n)", j(comp, FREEZE)),
        ("1000 prompts", j(comp, {"model": MODEL, "prompt": ["a"] * 1000, "max_tokens": 4})),
        ("prompt over the context", j(comp, {"model": MODEL, "prompt": "a" * 5000, "max_tokens": 4})),
        ("token prompt over the context", j(comp, {"model": MODEL, "prompt": list(range(5000))})),
        ("max_tokens over the context", j(comp, {"model": MODEL, "prompt": "a", "max_tokens": 100000})),
        ("negative token id", j(comp, {"model": MODEL, "prompt": [-1]})),
        ("token id past the vocabulary", j("/generate", {"input_ids": [10 ** 9], "sampling_params": {}})),
        ("generate without a prompt", j("/generate", {"sampling_params": {}})),
        ("body over the limit", request_bytes("POST", comp, b" " * (9 << 20))),
        ("unknown route", j("/v1/nothing", {})),
        ("GET on a POST route", request_bytes("GET", comp)),
        ("malformed request line", b"BLAH\r\n\r\n"),
        ("URI too long", request_bytes("GET", "/" + "a" * 20000)),
        ("header too large", request_bytes("GET", "/v1/models", extra="X-Big: " + "b" * 40000 + "\r\n")),
    ]


# --- probes ---------------------------------------------------------------------------------------

def freeze_probe(url: str) -> dict[str, Any]:
    """The freeze request and a small request sent together: both statuses and latencies."""
    small = {"model": MODEL, "prompt": "hi", "max_tokens": 4, "temperature": 0}

    async def run() -> tuple[Reply, Reply]:
        big, little = await asyncio.gather(send(url, request_bytes("POST", "/v1/completions", _dumps(FREEZE))),
                                           send(url, request_bytes("POST", "/v1/completions", _dumps(small))))
        return big, little

    big, little = asyncio.run(run())
    err = big.error_object or {}
    return {"freeze_status": big.status, "freeze_s": big.seconds, "freeze_code": err.get("code"),
            "freeze_message": err.get("message"), "small_status": little.status, "small_s": little.seconds}


def memory_kb(pid: int, key: str = "VmRSS") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


def big_body_probe(url: str, pid: int, size: int = 50 << 20, chunked: bool = False, close: bool = False,
                   ) -> dict[str, Any]:
    """A `size`-byte JSON body to `url` (a response layer whose process is `pid`), sent while the
    reply is read, on a keep-alive connection (what HTTP clients use) or with `Connection: close`:
    status, seconds to the status line, and the process's peak RSS growth (VmHWM, reset first)."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # reset VmHWM to the current RSS
    base = memory_kb(pid, "VmHWM")
    payload = b'{"model": "netra-tiny", "prompt": "' + b"a" * (size - 40) + b'"}'

    async def write(writer: asyncio.StreamWriter) -> None:
        try:
            writer.write(("POST /v1/completions HTTP/1.1\r\nHost: netra\r\n"
                          + ("Connection: close\r\n" if close else "") + "Content-Type: application/json\r\n"
                          + ("Transfer-Encoding: chunked\r\n" if chunked else f"Content-Length: {len(payload)}\r\n")
                          + "\r\n").encode())
            step = 1 << 20
            for i in range(0, len(payload), step):
                part = payload[i:i + step]
                writer.write(b"%x\r\n%s\r\n" % (len(part), part) if chunked else part)
                await writer.drain()
            if chunked:
                writer.write(b"0\r\n\r\n")
                await writer.drain()
        except (ConnectionError, OSError):
            pass  # the server answered and closed: the reply is what counts

    reply = asyncio.run(send(url, write, timeout=60))
    peak = memory_kb(pid, "VmHWM")
    err = reply.error_object or {}
    return {"status": reply.status, "error": reply.error, "seconds": reply.seconds, "code": err.get("code"),
            "peak_rss_growth_mb": (peak - base) / 1024, "size_mb": size / (1 << 20), "chunked": chunked,
            "close": close}


def rid_race(url: str, attacks: int = 5) -> dict[str, Any]:
    """A victim streams /generate with rid "victim"; an attacker sends /generate with the same rid
    and hangs up within 5 ms, `attacks` times. The victim's final event, and the attackers' fate."""
    victim = {"input_ids": [1, 2, 3], "rid": "victim", "stream": True,
              "sampling_params": {"max_new_tokens": 48, "temperature": 0, "ignore_eos": True}}
    attack = _dumps({"input_ids": [1], "rid": "victim", "sampling_params": {"max_new_tokens": 500}})

    async def run() -> Reply:
        stream = asyncio.ensure_future(send(url, request_bytes("POST", "/generate", _dumps(victim))))
        await asyncio.sleep(0.2)
        host, port = url.removeprefix("http://").rsplit(":", 1)
        for _ in range(attacks):
            _, w = await asyncio.open_connection(host, int(port))
            w.write(request_bytes("POST", "/generate", attack))
            await w.drain()
            await asyncio.sleep(0.005)
            w.close()
        return await stream

    reply = asyncio.run(run())
    events = [json.loads(b[6:]) for b in reply.body.split(b"\n\n") if b.startswith(b"data: {")]
    final = events[-1]["meta_info"] if events and "meta_info" in events[-1] else {}
    return {"status": reply.status, "events": len(events), "finish": (final.get("finish_reason") or {}).get("type"),
            "completion_tokens": final.get("completion_tokens"), "id": final.get("id"),
            "done": reply.body.rstrip().endswith(b"data: [DONE]")}


def classify(reply: Reply) -> str:
    if reply.status is None:
        return reply.error or "closed"
    if reply.status == 200:
        ok = reply.body.rstrip().endswith(b"data: [DONE]") and b'data: {"error"' not in reply.body
        return "completed" if ok else "error_event"
    if reply.status == 503 and reply.error_object is not None and "retry-after" in reply.headers:
        return "json_503"
    return f"status_{reply.status}"


def streams(url: str, n: int, max_tokens: int = 8, timeout: float = 120.0) -> dict[str, Any]:
    """`n` concurrent streamed completions, one connection each: outcome counts and latencies."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < n + 256 <= hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    body = _dumps({"model": MODEL, "prompt": "hello", "max_tokens": max_tokens, "temperature": 0,
                         "ignore_eos": True, "stream": True})
    data = request_bytes("POST", "/v1/completions", body)

    async def run() -> list[Reply]:
        return list(await asyncio.gather(*[send(url, data, timeout) for _ in range(n)]))

    t0 = time.perf_counter()
    replies = asyncio.run(run())
    wall = time.perf_counter() - t0
    outcomes = Counter(classify(r) for r in replies)
    done = sorted(r.seconds for r in replies if classify(r) == "completed")
    refused = sorted(r.seconds for r in replies if classify(r) == "json_503")
    return {"concurrency": n, "outcomes": dict(outcomes), "wall_s": wall,
            "completed_headers_s_max": done[-1] if done else None,
            "refused_s_p50": statistics.median(refused) if refused else None}


# --- a launch -----------------------------------------------------------------------------------

def netra_cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "netra", *args], capture_output=True, text=True, timeout=timeout,
                          cwd=SOURCE_ROOT)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Launched:
    run_dir: Path
    url: str

    def record(self) -> dict[str, Any]:
        from netra.deploy.record import read_record

        return read_record(self.run_dir)

    def worker(self, index: int) -> dict[str, Any]:
        return dict(self.record()["workers"][index])


def launch_local(run_dir: Path) -> Launched:
    import random
    import socket

    front = free_port()
    for _ in range(100):  # four consecutive free ports for the workers
        base = random.randrange(20000, 60000)
        ok = True
        for p in range(base, base + 4):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", p))
                except OSError:
                    ok = False
        if ok:
            break
    out = netra_cli("launch", "--profile", "local", "--front-port", str(front), "--port-base", str(base),
                    "--run-dir", str(run_dir), "--detach")
    if out.returncode != 0:
        raise RuntimeError(f"netra launch failed:\n{out.stdout}\n{out.stderr}")
    return Launched(run_dir, f"http://127.0.0.1:{front}")


def served_by(url: str, n: int) -> list[float]:
    """Latencies of `n` small requests sent one after another (each on a new connection)."""
    out = []
    for _ in range(n):
        r = post(url, "/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 2}, timeout=30)
        if r.status != 200:
            raise AssertionError(f"a request got {r.status or r.error}: {r.body[:300]!r}")
        out.append(r.seconds)
    return out


def sigstop_probe(local: Launched, index: int, role: str, cont: bool, duration_s: float = 8.0) -> dict[str, Any]:
    """SIGSTOP worker `index`'s `role` process while small requests go out one after another for
    `duration_s` (each must complete); with `cont`, SIGCONT it as soon as the launch record shows it
    out of rotation (otherwise the supervisor restarts it); then wait until it is up and in
    rotation again. Latencies are of the requests sent after the SIGSTOP."""
    import threading

    pid = local.worker(index)[role]["pid"]
    latencies: list[float] = []
    failure: list[BaseException] = []
    done = threading.Event()

    def load() -> None:
        try:
            while not done.is_set():
                latencies.extend(served_by(local.url, 1))
        except BaseException as exc:
            failure.append(exc)

    os.kill(pid, signal.SIGSTOP)
    t0 = time.monotonic()
    thread = threading.Thread(target=load, daemon=True)
    thread.start()
    out_at = back_at = None
    continued = False
    try:
        while time.monotonic() - t0 < 90:
            w = local.worker(index)
            now = time.monotonic() - t0
            if out_at is None and w["status"] != "up":
                out_at = now
                if cont:
                    os.kill(pid, signal.SIGCONT)
                    continued = True
            if back_at is None and out_at is not None and w["status"] == "up" and (cont or w[role]["pid"] != pid):
                back_at = now
            if back_at is not None and now >= duration_s:
                break
            time.sleep(0.1)
    finally:
        if not continued:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        done.set()
        thread.join(60)
    if failure:
        raise AssertionError(f"a request failed during the SIGSTOP of worker {index}'s {role}: {failure[0]}")
    if out_at is None or back_at is None:
        raise AssertionError(f"worker {index} ({role} stopped): out of rotation at {out_at}, back at {back_at}")
    return {"role": role, "index": index, "requests": len(latencies), "max_s": max(latencies),
            "p50_s": statistics.median(latencies), "out_of_rotation_after_s": out_at, "back_after_s": back_at,
            "restarted": w[role]["pid"] != pid, "rotation": w.get("rotation", []), "restarts": w.get("restarts", [])}


def serve_rss_mb(local: Launched) -> list[float]:
    return [memory_kb(w["serve"]["pid"]) / 1024 for w in local.record()["workers"]]


# --- the tool -----------------------------------------------------------------------------------

def run_all(local: Launched, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Every probe in turn (faults last); returns the measured figures."""
    out: dict[str, Any] = {}
    bad = [(name, asyncio.run(send(local.url, data, 30))) for name, data in bad_inputs()]
    out["bad_inputs"] = {"count": len(bad), "statuses": dict(Counter(str(r.status) for _, r in bad)),
                         "all_4xx_json": all(r.status is not None and 400 <= r.status < 500 and r.error_object
                                             for _, r in bad)}
    out["good_after_bad"] = post(local.url, "/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 2}).status
    log(f"bad inputs: {out['bad_inputs']}")
    out["freeze"] = freeze_probe(local.url)
    log(f"freeze: {out['freeze']}")
    w0 = local.worker(0)
    out["body_50mb"] = [big_body_probe(w0["serve_url"], w0["serve"]["pid"], chunked=c) for c in (False, True)]
    out["body_50mb_connection_close"] = [big_body_probe(w0["serve_url"], w0["serve"]["pid"], chunked=c, close=True)
                                         for c in (False, True)]
    out["body_50mb_front"] = big_body_probe(local.url, w0["serve"]["pid"])
    log(f"50 MB body: {out['body_50mb']}")
    out["rid_race"] = rid_race(local.url)
    log(f"rid race: {out['rid_race']}")
    out["c1024"] = streams(local.url, 1024)
    log(f"C=1024 streams: {out['c1024']}")
    rss = [serve_rss_mb(local)]
    for _ in range(3):
        streams(local.url, 128)
        rss.append(serve_rss_mb(local))
    out["rss_mb_after_loads"] = rss
    log(f"response-layer RSS (MB) after each load: {rss}")
    out["sigstop_engine"] = sigstop_probe(local, 1, "engine", cont=True)
    log(f"SIGSTOP engine: {out['sigstop_engine']}")
    out["sigstop_serve"] = sigstop_probe(local, 0, "serve", cont=False)
    log(f"SIGSTOP response layer: {out['sigstop_serve']}")
    return out


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--results-dir", type=Path, default=None,
                   help="where the record goes (default: $NETRA_RUN_DIR/records; results/serving to keep it)")
    p.add_argument("--no-record", action="store_true", help="print only")


def main(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="netra-hostile-") as tmp:
        local = launch_local(Path(tmp) / "run")
        try:
            figures = run_all(local)
        finally:
            netra_cli("stop", "--run-dir", str(local.run_dir), timeout=120)
    rows = [{"scenario": "hostile-local", "clients": 1, "workers": 2, **{
        "freeze_s": figures["freeze"]["freeze_s"], "small_beside_freeze_s": figures["freeze"]["small_s"],
        "body_50mb_s": max(b["seconds"] for b in figures["body_50mb"]),
        "body_50mb_peak_rss_growth_mb": max(b["peak_rss_growth_mb"] for b in figures["body_50mb"]),
        "c1024_outcomes": figures["c1024"]["outcomes"], "c1024_wall_s": figures["c1024"]["wall_s"],
        "sigstop_engine_max_request_s": figures["sigstop_engine"]["max_s"],
        "sigstop_engine_out_of_rotation_s": figures["sigstop_engine"]["out_of_rotation_after_s"],
        "sigstop_serve_max_request_s": figures["sigstop_serve"]["max_s"]}}]
    c = figures["c1024"]["outcomes"]
    checks = {
        "bad_inputs_all_4xx_json": figures["bad_inputs"]["all_4xx_json"], "good_after_bad": figures["good_after_bad"] == 200,
        "freeze_400_and_small_under_1s": figures["freeze"]["freeze_status"] == 400 and figures["freeze"]["small_s"] < 1,
        "body_50mb_under_1s_and_100mb": all(b["seconds"] < 1 and b["peak_rss_growth_mb"] < 100
                                            for b in figures["body_50mb"]),
        "rid_race_victim_finished": figures["rid_race"]["finish"] == "length",
        "c1024_no_resets": set(c) <= {"completed", "json_503"},
        "sigstop_engine_requests_under_5s": figures["sigstop_engine"]["max_s"] < 5,
    }
    record = {"kind": "serving", "family": "hostile-local", "target": "cpu", "device": host_device(),
              "git_sha": git_sha(), "date": utc_now(), "command": "netra bench hostile --results-dir results/serving", "status": "measured",
              "rows": rows, "checks": checks, "figures": figures,
              "verdict": "accepted" if all(checks.values()) else "rejected"}
    print(json.dumps(rows[0], indent=2))
    print(json.dumps(checks, indent=2))
    if not args.no_record:
        stem = f"hostile-local-{utc_now().replace(':', '').replace('-', '')}"
        path = write_record(record, args.results_dir or settings.records_dir(), stem)
        print(f"wrote {path}")
    return 0 if all(checks.values()) else 1
