"""A scriptable OpenAI-compatible HTTP server for tests: a real process on a real port.

    python tests/routing/fake_upstream.py --port 0     # prints "READY <port>" when listening

Every backend gets its own name through the URL: `/<name>/v1/embeddings`,
`/<name>/v1/chat/completions`, `/<name>/v1/rerank` (plain `/v1/...` is the name "default").

Control endpoints (JSON):
- `POST /_script/<name>` sets that name's behaviour:
    {"mode": "ok" | "429" | "500" | "400" | "hang" | "malformed" | "quota" | "raw",
     "times": N,             # only for the next N calls, then "ok" again (default: always)
     "retry_after": 2,       # 429: Retry-After seconds
     "hang_s": 5,            # hang: sleep this long before answering
     "quota": 3, "quota_window_s": 30,   # quota: a real limiter, with x-ratelimit-* headers
     "body": {...},          # raw: answer exactly this JSON
     "headers": {...}}       # extra headers on every answer
- `POST /_reset` forgets scripts and calls.
- `GET /_calls` → {"calls": [{"name", "path", "t", "status", "auth", "body"}]}.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

EMBEDDING_DIM = 8

_lock = threading.Lock()
_scripts: dict[str, dict] = {}
_calls: list[dict] = []
_quota_state: dict[str, dict] = {}


def fake_vector(text: str) -> list[float]:
    digest = hashlib.sha256(text.encode()).digest()
    return [round(b / 255.0 - 0.5, 6) for b in digest[:EMBEDDING_DIM]]


def words(text: str) -> set[str]:
    return {w.strip(".,?!").lower() for w in text.split() if w.strip(".,?!")}


def embeddings_body(request: dict) -> dict:
    texts = request["input"] if isinstance(request["input"], list) else [request["input"]]
    tokens = sum(len(t.split()) for t in texts)
    return {
        "object": "list",
        "data": [
            {"object": "embedding", "index": i, "embedding": fake_vector(t)}
            for i, t in enumerate(texts)
        ],
        "model": request.get("model", ""),
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }


def chat_body(request: dict) -> dict:
    prompt = " ".join(m.get("content", "") for m in request.get("messages", []))
    answer = f"fake answer to: {prompt[:40]}"
    prompt_tokens, completion_tokens = len(prompt.split()), len(answer.split())
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": request.get("model", ""),
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": answer, "refusal": None},
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


def rerank_body(request: dict) -> dict:
    query = words(request["query"])
    docs = request["documents"]
    scores = [len(query & words(d)) / (len(query) or 1) for d in docs]
    order = sorted(range(len(docs)), key=lambda i: (-scores[i], i))
    if request.get("top_n"):
        order = order[: request["top_n"]]
    tokens = sum(len(d.split()) + len(request["query"].split()) for d in docs)
    return {
        "model": request.get("model", ""),
        "results": [{"index": i, "relevance_score": scores[i]} for i in order],
        "usage": {"total_tokens": tokens},
    }


ANSWERS = {
    "/v1/embeddings": embeddings_body,
    "/v1/chat/completions": chat_body,
    "/v1/rerank": rerank_body,
}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format, *args):  # noqa: A002 - quiet test output
        pass

    def _send(self, status: int, body: bytes | dict, headers: dict | None = None) -> None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for key, value in (headers or {}).items():
            self.send_header(key, str(value))
        self.end_headers()
        try:
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (a timeout test)

    def _json_body(self) -> dict:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b"{}"
        return json.loads(raw or b"{}")

    def do_GET(self):
        if self.path.startswith("/_calls"):
            with _lock:
                return self._send(200, {"calls": list(_calls)})
        self._send(404, {"error": {"message": "not found"}})

    def do_POST(self):
        if self.path == "/_reset":
            with _lock:
                _scripts.clear()
                _calls.clear()
                _quota_state.clear()
            return self._send(200, {"ok": True})
        if self.path.startswith("/_script/"):
            name = self.path[len("/_script/") :]
            with _lock:
                _scripts[name] = self._json_body()
                _quota_state.pop(name, None)
            return self._send(200, {"ok": True})
        name, _, api_path = self.path.lstrip("/").partition("/")
        api_path = "/" + api_path
        if name == "v1":
            name, api_path = "default", self.path
        answer = ANSWERS.get(api_path)
        if answer is None:
            return self._send(404, {"error": {"message": f"no route {self.path}"}})
        request = self._json_body()
        # Recorded on arrival (a hanging answer is still a call); the status when answered.
        call = {
            "name": name,
            "path": api_path,
            "t": time.time(),
            "status": None,
            "auth": self.headers.get("Authorization", ""),
            "body": request,
        }
        with _lock:
            _calls.append(call)
        status, body, headers = self._behave(name, request, answer)
        call["status"] = status
        self._send(status, body, headers)

    def _behave(self, name: str, request: dict, answer) -> tuple[int, bytes | dict, dict]:
        with _lock:
            script = _scripts.get(name, {})
            mode = script.get("mode", "ok")
            if script.get("times") is not None:
                if script["times"] <= 0:
                    mode = "ok"
                else:
                    script["times"] -= 1
            headers = dict(script.get("headers") or {})
            if mode == "quota":
                state = _quota_state.setdefault(name, {"start": time.time(), "used": 0})
                window = float(script.get("quota_window_s", 60))
                if time.time() - state["start"] >= window:
                    state.update(start=time.time(), used=0)
                limit = int(script.get("quota", 10))
                reset_s = max(0.0, window - (time.time() - state["start"]))
                over = state["used"] >= limit
                if not over:
                    state["used"] += 1
                headers.update(
                    {
                        "x-ratelimit-limit-requests": limit,
                        "x-ratelimit-remaining-requests": max(0, limit - state["used"]),
                        "x-ratelimit-reset-requests": f"{reset_s:.3f}s",
                    }
                )
                if over:
                    headers["retry-after"] = f"{max(1, round(reset_s))}"
                    return 429, {"error": {"message": "quota exceeded"}}, headers
        if mode == "429":
            headers.setdefault("retry-after", script.get("retry_after", 1))
            headers.setdefault("x-ratelimit-remaining-requests", 0)
            return 429, {"error": {"message": "Rate limit reached", "type": "requests"}}, headers
        if mode == "500":
            return 500, {"error": {"message": "upstream exploded"}}, headers
        if mode == "400":
            return 400, {"error": {"message": "invalid input", "type": "invalid_request"}}, headers
        if mode == "malformed":
            return 200, b'{"object": "list", "data": [', headers
        if mode == "hang":
            time.sleep(float(script.get("hang_s", 5)))
        if mode == "raw":
            return 200, script["body"], headers
        return 200, answer(request), headers


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=8099)
    parser.add_argument("--host", default="127.0.0.1")
    args = parser.parse_args()
    server = ThreadingHTTPServer((args.host, args.port), Handler)
    server.daemon_threads = True
    print(f"READY {server.server_address[1]}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        sys.stdout.flush()


if __name__ == "__main__":
    main()
