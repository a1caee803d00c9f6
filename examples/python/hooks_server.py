#!/usr/bin/env python3
"""An agentd hook server with the standard library only: a policy, a redaction and a run ledger.

    AGENTD_HOOK_SECRET=change-me-16-chars-or-more python3 hooks_server.py --port 9000

and in the AGENTD_HOOKS_CONFIG file:

    {"hooks": [
      {"name": "docs-only", "on": "preToolUse",  "url": "http://127.0.0.1:9000/policy", "tools": ["fs_write"], "secret": "…"},
      {"name": "redact",    "on": "postToolUse", "url": "http://127.0.0.1:9000/redact", "onFailure": "deny", "secret": "…"},
      {"name": "ledger",    "on": "runEnd",      "url": "http://127.0.0.1:9000/runs",   "secret": "…"}
    ]}

/policy denies fs_write outside docs/, /redact removes API keys from what the model reads,
/runs prints each finished run once (runEnd is delivered at least once: drop repeated deliveryIds).
Every request is checked against X-Agentd-Signature first; a bad signature gets 401.
"""
import argparse
import hashlib
import hmac
import json
import os
import re
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SECRET = os.environ.get("AGENTD_HOOK_SECRET", "").encode()
API_KEY = re.compile(r"(sk-[A-Za-z0-9_-]{8,}|AKIA[0-9A-Z]{16})")
seen_deliveries = set()


def signature_ok(body: bytes, header: str) -> bool:
    """X-Agentd-Signature is sha256=<hex HMAC-SHA256 of the raw body>; compare in constant time."""
    expected = "sha256=" + hmac.new(SECRET, body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected, header or "")


def policy(event: dict) -> dict:
    call = event["call"]
    path = str(call["input"].get("path", ""))
    if call["name"] == "fs_write" and not path.startswith("docs/"):
        return {"decision": "deny", "reason": "fs_write is allowed only under docs/"}
    return {"decision": "allow"}


def redact(event: dict) -> dict:
    text = json.dumps(event["output"])
    clean = API_KEY.sub("[redacted]", text)
    return {"output": json.loads(clean)} if clean != text else {}


def ledger(event: dict) -> dict:
    if event["deliveryId"] not in seen_deliveries:
        seen_deliveries.add(event["deliveryId"])
        run = event["run"]
        print(f"run {run['id']} {run['status']} request={run['requestId']} tokens={run['usage']['totalTokens']}", flush=True)
    return {}


ROUTES = {"/policy": policy, "/redact": redact, "/runs": ledger}


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        route = ROUTES.get(self.path)
        if route is None:
            return self.answer(404, {"error": "no such hook"})
        if not signature_ok(body, self.headers.get("x-agentd-signature")):
            return self.answer(401, {"error": "bad signature"})
        self.answer(200, route(json.loads(body)))

    def answer(self, status: int, payload: dict):
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=9000)
    args = parser.parse_args()
    if len(SECRET) < 16:
        sys.exit("set AGENTD_HOOK_SECRET (16+ characters), the same secret as in the hooks file")
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    print(f"listening on {server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
