#!/usr/bin/env python3
"""A minimal agentd client in Python, standard library only.

It creates a session, sends one message, follows the run's events over Server-Sent Events,
and prints the assistant's final answer:

    python3 agentd_client.py --base-url http://127.0.0.1:3000 [--api-key KEY] "What is in my workspace?"

Output: one line per event on stderr (`seq type data-as-json`), and the final assistant text on
stdout, so `answer=$(python3 agentd_client.py "hi")` captures just the answer while the events
still scroll by.

Exit status: 0 when the run completed; 1 when it ended any other way (failed, interrupted,
max_steps); 2 when agentd answered with an HTTP error or could not be reached.

If the connection drops mid-run, the client reconnects to GET /v1/sessions/{id}/events?until=done
with the Last-Event-ID header: agentd replays what was missed, then goes on live.
"""

from __future__ import annotations

import argparse
import codecs
import http.client
import json
import os
import re
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass

# agentd sends ': ping' every 15 s, so a minute of silence means the connection is dead.
STREAM_TIMEOUT_S = 60
# Reconnections in a row without an event before giving up; an event received starts the count again.
MAX_RECONNECTS = 5
# Used until the server's `retry:` field says otherwise (agentd opens every stream with retry: 2000).
DEFAULT_RETRY_MS = 2000


class ApiError(Exception):
    """A non-2xx answer from agentd, with the code and message of its error envelope."""

    def __init__(self, status: int, code: str, message: str, request_id: str | None,
                 retryable: bool = False, retry_after_s: float | None = None):
        super().__init__(f"{code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.request_id = request_id
        # The envelope's "retryable": the same request may succeed later (503 UNAVAILABLE while a
        # process drains or its store is out of reach, 429), after Retry-After when there is one.
        self.retryable = retryable
        self.retry_after_s = retry_after_s


@dataclass
class SseEvent:
    """One dispatched Server-Sent Event."""

    type: str
    data: str
    # The stream's last event ID when this event was dispatched (what Last-Event-ID resumes from).
    last_event_id: str | None


class SseParser:
    """Turns the text of an event stream into events, per the WHATWG Server-Sent Events rules."""

    def __init__(self) -> None:
        # The ID of the last frame dispatched (what a reconnection resumes after); an `id:` line sets
        # _id first, and it counts only once its frame is complete.
        self.last_event_id: str | None = None
        self._id: str | None = None
        self.retry_ms: int | None = None
        self._pending: list[str] = []
        self._after_cr = False
        self._started = False
        self._type = ""
        self._data: list[str] = []

    def feed(self, text: str) -> list[SseEvent]:
        """Parses the next piece of the stream; returns the events it completed."""
        if not self._started and text:
            self._started = True
            text = text.removeprefix("\ufeff")
        if not text:
            return []
        # A CR that ended the last piece was a line end; a LF opening this one is the rest of that CRLF.
        if self._after_cr and text.startswith("\n"):
            text = text[1:]
        self._after_cr = text.endswith("\r")
        # Only the new text is split: the start of an unfinished line waits in pieces, so a large
        # event costs time linear in its size.
        *lines, rest = re.split(r"\r\n|\r|\n", text)
        if lines:
            lines[0] = "".join(self._pending) + lines[0]
            self._pending = []
        if rest:
            self._pending.append(rest)
        events = []
        for line in lines:
            event = self._line(line)
            if event is not None:
                events.append(event)
        return events

    def end(self) -> None:
        """The connection ended: its unfinished line and frame, with the frame's `id:`, are dropped (the
        standard's rule), as a resumed stream sends that event again whole. The last event ID and retry delay stay."""
        self._pending, self._after_cr, self._type, self._data = [], False, "", []
        self._id = self.last_event_id
        # A new connection may open with its own byte order mark.
        self._started = False

    def _line(self, line: str) -> SseEvent | None:
        if line == "":
            return self._dispatch()
        if line.startswith(":"):
            return None  # a comment, such as agentd's ': ping' keep-alive
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._type = value
        elif name == "id" and "\0" not in value:
            self._id = value
        elif name == "retry" and re.fullmatch(r"[0-9]+", value):
            self.retry_ms = int(value)
        # Any other field is ignored, as the standard says.
        return None

    def _dispatch(self) -> SseEvent | None:
        self.last_event_id = self._id
        data, event_type = self._data, self._type
        self._data, self._type = [], ""
        if not data:
            return None  # a block without data (e.g. only `retry:`) dispatches nothing
        return SseEvent(type=event_type or "message", data="\n".join(data), last_event_id=self.last_event_id)


class AgentdClient:
    """The few agentd calls this example needs."""

    def __init__(self, base_url: str, api_key: str | None = None):
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key

    def create_session(self, body: dict | None = None) -> dict:
        """POST /v1/sessions; returns the Session."""
        with self._open("POST", "/v1/sessions", body or {}, accept="application/json", timeout=30) as response:
            return json.load(response)

    def stream_message(self, session_id: str, content: str):
        """Sends a message and yields its run's events until `done`, reconnecting with Last-Event-ID if the stream drops."""
        # Where this run's events will start: a reconnection before its first event resumes from here,
        # not from 0, which would replay the session's earlier runs and stop at their `done`.
        with self._open("GET", f"/v1/sessions/{session_id}", None, accept="application/json", timeout=30) as response:
            start_seq = str(json.load(response)["lastSeq"])
        response = self._open(
            "POST", f"/v1/sessions/{session_id}/messages", {"content": content},
            accept="text/event-stream", timeout=STREAM_TIMEOUT_S,
        )
        parser = SseParser()
        reconnects = 0
        while True:
            try:
                if response is None:
                    response = self._open(
                        "GET", f"/v1/sessions/{session_id}/events?until=done", None, accept="text/event-stream",
                        timeout=STREAM_TIMEOUT_S, headers={"Last-Event-ID": parser.last_event_id or start_seq},
                    )
                with response:
                    for event in read_events(response, parser):
                        reconnects = 0
                        yield event
                        if event.type == "done":
                            return
                raise ConnectionError("the stream ended before the run was done")
            except (OSError, http.client.HTTPException, ApiError) as err:
                # A dropped connection, or an answer that says "try again later" (a reconnection that
                # reached a draining process behind a load balancer); any other answer is final.
                if isinstance(err, ApiError) and not err.retryable:
                    raise
                parser.end()
                reconnects += 1
                if reconnects > MAX_RECONNECTS:
                    raise
                if isinstance(err, ApiError) and err.retry_after_s is not None:
                    delay_s = err.retry_after_s
                else:
                    delay_s = (parser.retry_ms if parser.retry_ms is not None else DEFAULT_RETRY_MS) / 1000
                print(f"stream dropped ({err or type(err).__name__}); reconnecting in {delay_s:g} s "
                      f"from event {parser.last_event_id or start_seq}", file=sys.stderr)
                time.sleep(delay_s)
                response = None

    def _open(self, method: str, path: str, body: dict | None, accept: str, timeout: float, headers: dict | None = None):
        request = urllib.request.Request(self.base_url + path, method=method)
        request.add_header("Accept", accept)
        request.add_header("User-Agent", "agentd-python-example/1")
        if self.api_key:
            request.add_header("Authorization", f"Bearer {self.api_key}")
        for name, value in (headers or {}).items():
            request.add_header(name, value)
        if body is not None:
            request.add_header("Content-Type", "application/json")
            request.data = json.dumps(body).encode("utf-8")
        try:
            return urllib.request.urlopen(request, timeout=timeout)
        except urllib.error.HTTPError as err:
            raise api_error(err) from None


def api_error(err: urllib.error.HTTPError) -> ApiError:
    """Reads agentd's error envelope, {"error": {"code", "message", "requestId", ...}}, from an HTTP error."""
    retry_after = err.headers.get("Retry-After", "")
    retry_after_s = min(float(retry_after), 60.0) if retry_after.strip().isdigit() else None
    try:
        envelope = json.loads(err.read().decode("utf-8"))["error"]
        return ApiError(err.code, envelope["code"], envelope["message"], envelope.get("requestId"),
                        bool(envelope.get("retryable")), retry_after_s)
    except (ValueError, KeyError, TypeError):
        return ApiError(err.code, f"HTTP_{err.code}", err.reason or "no error envelope", err.headers.get("x-request-id"))


def read_events(response, parser: SseParser):
    """Yields the events of an SSE response as its bytes arrive."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    while True:
        chunk = response.read1(65536)  # returns as soon as some bytes are there
        if not chunk:
            return
        yield from parser.feed(decoder.decode(chunk))


def main(argv: list[str] | None = None) -> int:
    arguments = argparse.ArgumentParser(description="Send one message to agentd and follow the run.")
    arguments.add_argument("--base-url", default=os.environ.get("AGENTD_URL", "http://127.0.0.1:3000"))
    arguments.add_argument("--api-key", default=os.environ.get("AGENTD_API_KEY"),
                           help="sent as Authorization: Bearer KEY (default: $AGENTD_API_KEY)")
    arguments.add_argument("message")
    args = arguments.parse_args(argv)

    client = AgentdClient(args.base_url, args.api_key)
    texts: dict[int, str] = {}  # the assistant text of each step
    done: dict | None = None
    failure: dict | None = None
    try:
        session = client.create_session()
        print(f"session {session['id']}", file=sys.stderr)
        for frame in client.stream_message(session["id"], args.message):
            event = json.loads(frame.data)  # the agentd Event: {seq, type, channel, runId, data, ...}
            data = event["data"]
            print(f"{event['seq']} {event['type']} {json.dumps(data, separators=(',', ':'))}", file=sys.stderr)
            if event["type"] == "text_chunk_end":
                texts[data["step"]] = data["text"]
            elif event["type"] == "error" and data.get("severity") == "error":
                failure = data["detail"]
            elif event["type"] == "done":
                done = data
    except ApiError as err:
        request_id = f", request {err.request_id}" if err.request_id else ""
        print(f"error: {err.code}: {err.message} (HTTP {err.status}{request_id})", file=sys.stderr)
        return 2
    except (OSError, http.client.HTTPException) as err:
        print(f"error: cannot reach agentd at {args.base_url}: {err}", file=sys.stderr)
        return 2

    assert done is not None  # stream_message only returns after `done`
    final_text = texts.get(done["step"], "")
    if final_text:
        print(final_text)
    if done["reason"] == "completed":
        return 0
    detail = f": {failure['code']}: {failure['message']}" if failure else ""
    print(f"run ended: {done['reason']}{detail}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
