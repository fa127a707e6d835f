"""Checks tests/agents/serve.py by hand: starts each framework's server, posts a RunAgentInput for
every behaviour, checks the answer and saves each SSE stream (one JSON event a line) under --out.

    $DATA/agents-venv/bin/python tests/agents/smoke.py [--framework pydantic|langgraph]... [--out DIR]

Prints `N passed, N failed`; exits 1 when a check failed.
"""

import argparse
import hashlib
import http.server
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

HERE = Path(__file__).resolve().parent
FILE_BYTES = bytes(range(256)) * 40 + b'switchboard'  # 10251 bytes
FILE_SHA = hashlib.sha256(FILE_BYTES).hexdigest()


class FileHandler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802
        self.send_response(200)
        self.send_header('content-type', 'application/pdf')
        self.send_header('content-length', str(len(FILE_BYTES)))
        self.end_headers()
        self.wfile.write(FILE_BYTES)

    def log_message(self, *args: Any) -> None:
        pass


def file_server() -> str:
    server = http.server.ThreadingHTTPServer(('127.0.0.1', 0), FileHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f'http://127.0.0.1:{server.server_address[1]}/files/doc.pdf?X-Amz-Signature=abc'


def user(text: str | list[Any], id: str | None = None) -> dict[str, Any]:
    return {'id': id or f'u-{uuid.uuid4().hex[:8]}', 'role': 'user', 'content': text}


def run_input(messages: list[dict[str, Any]], thread: str | None = None, **extra: Any) -> dict[str, Any]:
    body = {
        'threadId': thread or f't-{uuid.uuid4().hex[:8]}',
        'runId': f'r-{uuid.uuid4().hex[:8]}',
        'state': {},
        'messages': messages,
        'tools': [],
        'context': [],
        'forwardedProps': {},
    }
    body.update(extra)
    return body


def events_of(response: httpx.Response) -> list[dict[str, Any]]:
    events = []
    for line in response.text.splitlines():
        if line.startswith('data: '):
            events.append(json.loads(line[6:]))
    return events


def text_of(events: list[dict[str, Any]]) -> str:
    return ''.join(e.get('delta') or '' for e in events if e['type'] in ('TEXT_MESSAGE_CONTENT', 'TEXT_MESSAGE_CHUNK'))


class Smoke:
    def __init__(self, framework: str, out: Path, file_url: str):
        self.framework = framework
        self.out = out
        self.file_url = file_url
        self.passed = 0
        self.failed = 0
        self.log = out / f'{framework}.log'
        self.log.unlink(missing_ok=True)
        env = dict(os.environ, PYTHONUNBUFFERED='1')
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / 'serve.py'), '--framework', framework, '--port', '0', '--log', str(self.log)],
            stdout=subprocess.PIPE,
            stderr=open(out / f'{framework}.stderr', 'w'),
            text=True,
            env=env,
        )
        line = self.proc.stdout.readline()
        assert line.startswith('listening '), f'{framework}: unexpected first line {line!r}'
        self.url = f'http://127.0.0.1:{int(line.split()[1])}/'
        self.client = httpx.Client(timeout=60)

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)

    def check(self, name: str, ok: bool, detail: Any = '') -> None:
        if ok:
            self.passed += 1
        else:
            self.failed += 1
            print(f'FAIL {self.framework} {name}: {detail}')

    def post(self, name: str, body: Any, **kwargs: Any) -> tuple[httpx.Response, list[dict[str, Any]]]:
        content = body if isinstance(body, bytes) else json.dumps(body).encode()
        headers = {'content-type': 'application/json', 'accept': 'text/event-stream', **kwargs.pop('headers', {})}
        response = self.client.post(self.url, content=content, headers=headers, **kwargs)
        events = events_of(response) if response.headers.get('content-type', '').startswith('text/event-stream') else []
        with open(self.out / f'{self.framework}-{name}.txt', 'w') as f:
            f.write(f'POST {content.decode(errors="replace")}\n')
            f.write(f'HTTP {response.status_code} {response.headers.get("content-type")}\n')
            if events:
                for event in events:
                    f.write(json.dumps(event) + '\n')
            else:
                f.write(response.text + '\n')
        return response, events

    def ask(self, name: str, entry: dict[str, Any], want: str) -> None:
        thread = f't-ask-{uuid.uuid4().hex[:8]}'
        ask = user('/ask What is your favourite colour?')
        _, ev = self.post(name, run_input([ask], thread=thread, protocolVersion='1.0'))
        finished = ev[-1] if ev else {}
        outcome = finished.get('outcome') or {}
        self.check(f'{name}-interrupt', outcome.get('type') == 'interrupt' and outcome.get('interrupts'), finished)
        interrupt = (outcome.get('interrupts') or [{}])[0]
        entry = {'interruptId': interrupt.get('id'), **entry}
        if self.framework == 'pydantic':
            # Stateless: the history must carry the assistant message with the pending tool call.
            call_id = interrupt.get('toolCallId', '')
            start = next((e for e in ev if e['type'] == 'TOOL_CALL_START' and e['toolCallId'] == call_id), {})
            args = ''.join(e['delta'] for e in ev if e['type'] == 'TOOL_CALL_ARGS' and e['toolCallId'] == call_id)
            calls = [{'id': call_id, 'type': 'function', 'function': {'name': start.get('toolCallName', 'ask'), 'arguments': args}}]
            messages = [ask, {'id': start.get('parentMessageId', 'a-ask'), 'role': 'assistant', 'toolCalls': calls}]
            if entry['status'] == 'resolved':
                entry['payload'] = {'approved': True, 'editedArgs': {'question': 'What is your favourite colour?', 'answer': 'blue'}}
        else:
            # The thread's checkpoint is on the server; the history is the client's as it was.
            messages = [ask]
            if entry['status'] == 'resolved':
                entry['payload'] = 'blue'
        _, ev = self.post(f'{name}-resume', run_input(messages, thread=thread, resume=[entry], protocolVersion='1.0'))
        self.check(f'{name}-resume', want in text_of(ev), ev)

    def run_all(self) -> None:
        fw = self.framework

        # Plain text, with earlier messages of the thread.
        history = [user('hi there'), {'id': 'a-1', 'role': 'assistant', 'content': 'Hello!'}, user('hello')]
        _, ev = self.post('hello', run_input(history))
        types = [e['type'] for e in ev]
        self.check('hello', 'You said: hello (3 messages)' in text_of(ev), text_of(ev))
        self.check('hello-lifecycle', types[:1] == ['RUN_STARTED'] and types[-1:] == ['RUN_FINISHED'], types)

        # Earlier assistant tool calls and tool results in the history.
        call = {'id': 'call-1', 'type': 'function', 'function': {'name': 'lookup', 'arguments': '{"query":"x"}'}}
        history = [
            user('/tool x'),
            {'id': 'a-2', 'role': 'assistant', 'content': None, 'toolCalls': [call]},
            {'id': 't-2', 'role': 'tool', 'toolCallId': 'call-1', 'content': '{"answer":"result for x"}'},
            {'id': 'a-3', 'role': 'assistant', 'content': 'Lookup result: ...'},
            user('hello'),
        ]
        _, ev = self.post('history-with-tools', run_input(history))
        self.check('history-with-tools', 'You said: hello (5 messages)' in text_of(ev), ev[-2:])

        # Reasoning, then text.
        _, ev = self.post('think', run_input([user('/think cats')]))
        types = [e['type'] for e in ev]
        self.check('think', 'REASONING_MESSAGE_CONTENT' in types and 'Thought about cats' in text_of(ev), types)

        # Backend tool.
        _, ev = self.post('tool', run_input([user('/tool weather in Paris')]))
        types = [e['type'] for e in ev]
        self.check('tool-events', all(t in types for t in ('TOOL_CALL_START', 'TOOL_CALL_ARGS', 'TOOL_CALL_END', 'TOOL_CALL_RESULT')), types)
        self.check('tool-text', '"answer":"result for weather in Paris"' in text_of(ev), text_of(ev))

        # State: remember, then a new thread carrying the snapshot.
        _, ev = self.post('remember-1', run_input([user('/remember buy milk')]))
        snapshots = [e['snapshot'] for e in ev if e['type'] == 'STATE_SNAPSHOT']
        self.check('remember-1', 'Notes: buy milk' in text_of(ev) and snapshots, (text_of(ev), snapshots))
        state = snapshots[-1] if snapshots else {}
        _, ev = self.post('remember-2', run_input([user('/remember call mom')], state=state))
        self.check('remember-2', 'Notes: buy milk, call mom' in text_of(ev), text_of(ev))
        _, ev = self.post('notes', run_input([user('/notes')], state={'notes': ['a', 'b']}))
        self.check('notes', 'Notes: a, b' in text_of(ev), text_of(ev))

        # Files, in every shape.
        shapes = {
            'document-url-value': {'type': 'document', 'source': {'type': 'url', 'value': self.file_url, 'mimeType': 'application/pdf'}},
            'image-url-value': {'type': 'image', 'source': {'type': 'url', 'value': self.file_url, 'mimeType': 'image/png'}},
            'document-url-no-mime': {'type': 'document', 'source': {'type': 'url', 'value': self.file_url}},
            'document-url-key-url': {'type': 'document', 'source': {'type': 'url', 'url': self.file_url, 'mimeType': 'application/pdf'}},
            'binary-url': {'type': 'binary', 'mimeType': 'application/pdf', 'url': self.file_url, 'filename': 'doc.pdf'},
        }
        expected = f'File: {len(FILE_BYTES)} bytes, sha256 {FILE_SHA}'
        for shape, part in shapes.items():
            response, ev = self.post(f'file-{shape}', run_input([user([{'type': 'text', 'text': '/file'}, part])]))
            ok = expected in text_of(ev)
            print(f'  {fw} /file {shape}: HTTP {response.status_code}, {"fetched" if ok else "not fetched"}: '
                  f'{(text_of(ev) or [e for e in ev if e["type"] == "RUN_ERROR"] or response.text)!s:.200}')
        _, ev = self.post('file', run_input([user([{'type': 'text', 'text': '/file'}, shapes['document-url-value']])]))
        self.check('file', expected in text_of(ev), text_of(ev))

        # Slow stream, closed by the client after a few events.
        body = run_input([user('/slow')])
        started = time.monotonic()
        seen = []
        with self.client.stream('POST', self.url, json=body, headers={'accept': 'text/event-stream'}) as response:
            for line in response.iter_lines():
                if line.startswith('data: '):
                    seen.append(json.loads(line[6:]))
                if sum(e['type'] == 'TEXT_MESSAGE_CONTENT' for e in seen) >= 5:
                    break
        with open(self.out / f'{fw}-slow-closed.txt', 'w') as f:
            f.writelines(json.dumps(e) + '\n' for e in seen)
        deadline = time.monotonic() + 5
        closed = f'closed {body["runId"]}'
        while closed not in self.log.read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        self.check('slow-closed', closed in self.log.read_text(), self.log.read_text())
        self.check('slow-timing', time.monotonic() - started < 8, time.monotonic() - started)
        self.check('slow-request-once', self.log.read_text().count(f'request {body["runId"]}') == 1, self.log.read_text())

        # Interrupt and resume, answered and cancelled.
        self.ask('ask', {'status': 'resolved'}, 'You answered: blue')
        self.ask('ask-cancel', {'status': 'cancelled'}, 'You cancelled')

        # Errors inside the agent.
        _, ev = self.post('fail', run_input([user('/fail')]))
        self.check('fail', any(e['type'] == 'RUN_ERROR' for e in ev), ev)

        # Invalid and unusual input.
        good = run_input([user('hello')])
        for name, body in {
            'invalid-no-threadId': {k: v for k, v in good.items() if k != 'threadId'},
            'invalid-no-runId': {k: v for k, v in good.items() if k != 'runId'},
            'invalid-no-messages': {k: v for k, v in good.items() if k != 'messages'},
            'invalid-bad-role': {**good, 'messages': [{'id': 'x', 'role': 'robot', 'content': 'hi'}]},
            'invalid-json': b'{not json',
            'minimal': {'threadId': 't-min', 'runId': 'r-min', 'messages': [user('hello')]},
            'unknown-fields': {**good, 'somethingNew': 1, 'messages': [{**user('hello'), 'extra': True}]},
            'null-optionals': {**good, 'state': None, 'tools': None, 'context': None, 'forwardedProps': None},
            'no-messages': {**good, 'messages': []},
        }.items():
            response, ev = self.post(name, body)
            print(f'  {fw} {name}: HTTP {response.status_code} {response.headers.get("content-type")} '
                  f'{[e["type"] for e in ev] if ev else response.text[:300]}')
        response, _ = self.post('wrong-content-type', good, headers={'content-type': 'text/plain'})
        print(f'  {fw} wrong-content-type: HTTP {response.status_code} {response.text[:200]}')


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument('--framework', action='append', choices=['pydantic', 'langgraph'])
    parser.add_argument('--out', type=Path)
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix='agents-smoke-'))
    out.mkdir(parents=True, exist_ok=True)
    file_url = file_server()
    passed = failed = 0
    for framework in args.framework or ['pydantic', 'langgraph']:
        smoke = Smoke(framework, out, file_url)
        try:
            smoke.run_all()
        finally:
            smoke.close()
        passed += smoke.passed
        failed += smoke.failed
    print(f'streams in {out}')
    print(f'{passed} passed, {failed} failed')
    sys.exit(1 if failed else 0)


if __name__ == '__main__':
    main()
