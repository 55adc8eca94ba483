"""Tiny stand-in processes for launcher tests (stdlib only, start in ~50 ms).

  python standin.py engine --host H --port N [engine flags...]
      /health, /server_info (the flags it was given, as SGLang dest names), /generate
      env STANDIN_DROP=a,b: leave options a and b out of /server_info (a wrapper that drops options)
      env STANDIN_SLOW=S: /generate takes S seconds (a request in flight when the engine is killed)
      env STANDIN_FAIL_MARKER=F: exit with 3 at startup while file F exists (a worker that cannot restart)
      env NETRA_PLUGIN_EVIDENCE=D (rendered for a profile with engine.tactics): write the evidence Netra's
      SGLang plugin writes, with every domain of NETRA_SGLANG_TACTICS hooked and applied and the code
      objects of env STANDIN_PLUGIN_TACTICS (JSON list) loaded; STANDIN_PLUGIN=absent: a worker whose
      environment lacks the plugin (nothing written)
  python standin.py serve --upstream URL --host H --port N [...]
      /health is 200 only when the upstream's /health is; POST /v1/completions forwards to /generate
      and answers {"worker": PORT, ...}; 503 when the upstream is unreachable, 502 when it fails.
      /metrics: standin_requests_total
  python standin.py launch --run-dir D --front-port P --port-base B
      `netra launch --profile local` with both processes replaced by these stand-ins (foreground).
"""

from __future__ import annotations

import http.client
import json
import os
import sys
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

HERE = Path(__file__).resolve()


def parse_flags(argv: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    i = 0
    while i < len(argv):
        key = argv[i].removeprefix("--").replace("-", "_")
        values = []
        i += 1
        while i < len(argv) and not argv[i].startswith("--"):
            values.append(argv[i])
            i += 1
        typed: list[Any] = []
        for v in values:
            try:
                typed.append(int(v))
            except ValueError:
                typed.append(v)
        out[key] = True if not typed else (typed[0] if len(typed) == 1 and key != "cuda_graph_bs" else typed)
    return out


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    role = ""
    opts: ClassVar[dict[str, Any]] = {}
    count = 0

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        return

    def send_json(self, status: int, obj: Any) -> None:
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def body(self) -> Any:
        n = int(self.headers.get("Content-Length") or 0)
        return json.loads(self.rfile.read(n) or b"{}")

    def do_GET(self) -> None:
        if self.path == "/health":
            if self.role == "engine" or upstream_ok(self.opts["upstream"]):
                self.send_json(200, {"ok": True})
            else:
                self.send_json(503, {"error": {"message": "upstream down"}})
        elif self.path == "/server_info" and self.role == "engine":
            drop = set(filter(None, os.environ.get("STANDIN_DROP", "").split(",")))
            self.send_json(200, {"version": "standin", "options": {k: v for k, v in self.opts.items()
                                                                   if k not in drop}})
        elif self.path == "/metrics":
            body = f"standin_requests_total {Handler.count}\n".encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        else:
            self.send_json(404, {"error": {"message": f"no {self.path}"}})

    def do_POST(self) -> None:
        req = self.body()
        if self.role == "engine" and self.path == "/generate":
            time.sleep(float(os.environ.get("STANDIN_SLOW", "0")))
            self.send_json(200, {"text": "ok", "output_ids": [1], "meta_info": {
                "id": "x", "finish_reason": {"type": "length", "length": 1}, "prompt_tokens": 1,
                "completion_tokens": 1, "port": self.opts["port"]}})
        elif self.role == "serve" and self.path == "/v1/completions":
            Handler.count += 1
            try:
                with urllib.request.urlopen(urllib.request.Request(
                        self.opts["upstream"] + "/generate", data=json.dumps({"text": req.get("prompt", "")}).encode(),
                        headers={"Content-Type": "application/json"}), timeout=60) as resp:
                    up = json.loads(resp.read())
            except urllib.error.URLError as exc:
                if isinstance(exc.reason, ConnectionRefusedError):
                    self.send_json(503, {"error": {"message": f"worker unreachable: {exc}", "code": 503}})
                else:
                    self.send_json(502, {"error": {"message": f"worker failed: {exc}", "code": 502}})
                return
            except (http.client.HTTPException, OSError) as exc:
                self.send_json(502, {"error": {"message": f"worker failed: {exc}", "code": 502}})
                return
            self.send_json(200, {"worker": self.opts["port"], "engine_port": up["meta_info"]["port"],
                                 "choices": [{"text": up["text"]}]})
        else:
            self.send_json(404, {"error": {"message": f"no {self.path}"}})


def upstream_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=0.2) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def launch(argv: list[str]) -> int:

    from netra.deploy.launch import Launch
    from netra.deploy.plan import Overrides, make_plan
    from netra.deploy.profile import load_profile
    from netra.deploy.verify import Verification

    opts = parse_flags(argv)
    plan = make_plan(load_profile("local"), None, Overrides(
        run_dir=Path(opts["run_dir"]), front_port=int(opts["front_port"]), port_base=int(opts["port_base"])))
    plan = standin_plan(plan)
    return Launch(plan, Verification(), log=lambda m: print(m, flush=True)).run()


def standin_plan(plan: Any) -> Any:
    """The plan with `netra engine` / `netra serve` replaced by this script (same flags)."""
    import dataclasses

    workers = tuple(dataclasses.replace(
        w, engine_argv=(sys.executable, str(HERE), "engine", *w.engine_argv[2:]),
        serve_argv=(sys.executable, str(HERE), "serve", *w.serve_argv[2:])) for w in plan.workers)
    return dataclasses.replace(plan, workers=workers)


def write_plugin_evidence() -> None:
    """What netra.plugins.sglang's register() and prepare() leave in a worker that loaded the plugin."""
    where = os.environ.get("NETRA_PLUGIN_EVIDENCE")
    if not where or os.environ.get("STANDIN_PLUGIN") == "absent":
        return
    from netra.plugins import evidence, sglang

    domains = sglang.parse_domains(os.environ.get("NETRA_SGLANG_TACTICS"))
    rec = evidence.Recorder(domains, None)
    for d in domains:
        rec.hook(d, target=sglang.DOMAINS[d].target, type="around", op=sglang.DOMAINS[d].op, registered=True,
                 applied=True)
    snap = rec.snapshot()
    snap["tactics"] = json.loads(os.environ.get("STANDIN_PLUGIN_TACTICS", "[]"))
    evidence.write(Path(where), snap)


def main() -> int:
    role, argv = sys.argv[1], sys.argv[2:]
    if role == "launch":
        return launch(argv)
    Handler.role = role
    Handler.opts = parse_flags(argv)
    marker = os.environ.get("STANDIN_FAIL_MARKER")
    if role == "engine" and marker and Path(marker).exists():
        print("standin engine: refusing to start (marker file present)", flush=True)
        return 3
    if role == "engine":
        write_plugin_evidence()
    server = ThreadingHTTPServer((Handler.opts["host"], int(Handler.opts["port"])), Handler)
    server.daemon_threads = True
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
