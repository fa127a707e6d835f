"""Deterministic AG-UI agent servers for Switchboard's system tests.

    $DATA/agents-venv/bin/python tests/agents/serve.py --framework pydantic|langgraph --port 0 [--log FILE]

Binds 127.0.0.1, prints exactly one line `listening <port>` on stdout once it accepts connections,
then serves until killed. POST / takes an AG-UI `RunAgentInput` and answers `text/event-stream`;
GET /health answers 200. No model, no key, no network: the agents' replies are scripted from the
text of the last user message.

    hello (anything else)  "You said: <text> (<n> messages)", n = len(RunAgentInput.messages)
    /tool <x>              calls the backend tool lookup(query=x), then "Lookup result: <json>"
    /remember <note>       appends <note> to state.notes (STATE_SNAPSHOT), "Notes: a, b"
    /notes                 "Notes: a, b" from the state it was given, unchanged
    /file                  fetches every http(s) url part of the message: "File: <n> bytes, sha256 <hex>"
    /think <x>             reasoning "Thinking about <x>", then the text "Thought about <x>"
    /slow                  100 text chunks, 100 ms apart
    /ask <question>        ends the run with an AG-UI interrupt (RUN_FINISHED outcome.type "interrupt");
                           the run that resumes it answers "You answered: <payload>", or
                           "You cancelled: ..." for a resume entry with status "cancelled"
    /fail                  raises inside the agent (RUN_ERROR)

/ask, per framework:
  langgraph  interrupt() in a graph node; the thread's checkpoint is kept in this process's memory,
             so the resuming run needs the same threadId, and `resume: [{interruptId, status,
             payload}]` with any JSON payload (a string is answered as is).
  pydantic   a tool call that needs approval (`ask(question, answer=None)`); the interrupt's id is
             `int-<toolCallId>`. Stateless: the resuming run's messages must hold the assistant
             message with that tool call, and the payload is `{"approved": true, "editedArgs":
             {"question": ..., "answer": "<answer>"}}` ("You answered: <answer>"; without editedArgs,
             "You answered: approved"); `{"approved": false}` or status "cancelled" is a denial.

--log FILE gets a line `request <runId>` for every POST and `closed <runId>` when the client
closes the request before the response is complete.
"""

import argparse
import asyncio
import contextvars
import hashlib
import json
import logging
import os
import socket
import sys
import uuid
from typing import Any

# Nothing leaves the machine: no LangSmith tracing whatever the environment says.
os.environ['LANGSMITH_TRACING'] = 'false'
os.environ['LANGCHAIN_TRACING_V2'] = 'false'

import httpx
import uvicorn

SLOW_CHUNKS = 100
SLOW_INTERVAL = 0.1

# The JSON body of the request being served (a dict), set by RequestLog for everything downstream.
CURRENT_INPUT: contextvars.ContextVar[dict[str, Any]] = contextvars.ContextVar('CURRENT_INPUT', default={})


def input_message_count() -> int:
    messages = CURRENT_INPUT.get().get('messages')
    return len(messages) if isinstance(messages, list) else 0


def lookup_result(query: str) -> dict[str, Any]:
    """The backend tool both frameworks call for `/tool <x>`."""
    return {'query': query, 'answer': f'result for {query}', 'length': len(query)}


def compact(value: Any) -> str:
    return json.dumps(value, separators=(',', ':'), sort_keys=True)


def payload_text(payload: Any) -> str:
    return payload if isinstance(payload, str) else compact(payload)


def notes_text(notes: list[str]) -> str:
    return 'Notes: ' + ', '.join(notes) if notes else 'Notes: (none)'


def split_chunks(text: str, size: int = 8) -> list[str]:
    """Several chunks, so a client sees a reply arrive in parts."""
    return [text[i : i + size] for i in range(0, len(text), size)] or ['']


def command(text: str) -> tuple[str, str]:
    """('/tool', 'x') for '/tool x'; ('', text) for plain text."""
    text = text.strip()
    if text.startswith('/'):
        name, _, rest = text.partition(' ')
        return name, rest.strip()
    return '', text


async def describe_files(urls: list[str]) -> str:
    if not urls:
        return 'File: no url part'
    lines = []
    async with httpx.AsyncClient(timeout=30) as client:
        for url in urls:
            response = await client.get(url)
            response.raise_for_status()
            body = response.content
            lines.append(f'File: {len(body)} bytes, sha256 {hashlib.sha256(body).hexdigest()}')
    return '\n'.join(lines)


def slow_chunks() -> list[str]:
    return [f'chunk {i} ' for i in range(SLOW_CHUNKS)]


class RequestLog:
    """ASGI middleware: logs `request <runId>` for each POST and `closed <runId>` when the client
    goes away before the response is complete, and exposes the parsed body through CURRENT_INPUT.

    It owns the server's `receive`: it reads the body itself, then watches for `http.disconnect`
    in a task of its own and passes it on to the app. Starlette's StreamingResponse then stops
    sending; Pydantic AI's run is cancelled with it, while ag-ui-langgraph's graph run goes on to
    its end in the background (a property of that adapter under Starlette, kept as it is)."""

    def __init__(self, app: Any, log_path: str | None):
        self.app = app
        self.log_path = log_path

    def log(self, line: str) -> None:
        if self.log_path:
            with open(self.log_path, 'a', encoding='utf-8') as f:
                f.write(line + '\n')
                f.flush()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope['type'] != 'http' or scope['method'] != 'POST':
            await self.app(scope, receive, send)
            return

        chunks = []
        while True:
            message = await receive()
            if message['type'] == 'http.disconnect':
                return
            chunks.append(message.get('body', b''))
            if not message.get('more_body'):
                break
        body = b''.join(chunks)
        try:
            parsed = json.loads(body)
        except ValueError:
            parsed = None
        parsed = parsed if isinstance(parsed, dict) else {}
        run_id = parsed.get('runId', parsed.get('run_id'))
        run_id = run_id if isinstance(run_id, str) else '-'
        self.log(f'request {run_id}')
        CURRENT_INPUT.set(parsed)

        response_complete = False
        disconnected = asyncio.Event()

        async def watch() -> None:
            message = await receive()
            if message['type'] == 'http.disconnect':
                if not response_complete:
                    self.log(f'closed {run_id}')
                disconnected.set()

        body_given = False

        async def app_receive() -> dict[str, Any]:
            nonlocal body_given
            if not body_given:
                body_given = True
                return {'type': 'http.request', 'body': body, 'more_body': False}
            await disconnected.wait()
            return {'type': 'http.disconnect'}

        async def app_send(message: dict[str, Any]) -> None:
            nonlocal response_complete
            if message['type'] == 'http.response.body' and not message.get('more_body', False):
                response_complete = True
            await send(message)

        watcher = asyncio.create_task(watch())
        try:
            await self.app(scope, app_receive, app_send)
        finally:
            watcher.cancel()


# --------------------------------------------------------------------------------------------
# Pydantic AI: AGUIAdapter.dispatch_request with a FunctionModel.


def pydantic_app() -> Any:
    from ag_ui.core import EventType, StateSnapshotEvent
    from pydantic import BaseModel, Field
    from pydantic_ai import Agent, DeferredToolRequests, RunContext, ToolReturn
    from pydantic_ai.messages import (
        ModelMessage,
        ModelRequest,
        RetryPromptPart,
        ToolReturnPart,
        UserPromptPart,
    )
    from pydantic_ai.models.function import AgentInfo, DeltaThinkingPart, DeltaToolCall, FunctionModel
    from pydantic_ai.ui import StateDeps
    from pydantic_ai.ui.ag_ui import AGUIAdapter
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    class Notes(BaseModel):
        notes: list[str] = Field(default_factory=list)

    def user_text_and_urls(part: UserPromptPart) -> tuple[str, list[str]]:
        if isinstance(part.content, str):
            return part.content, []
        texts, urls = [], []
        for item in part.content:
            if isinstance(item, str):
                texts.append(item)
            elif isinstance(getattr(item, 'url', None), str):
                urls.append(item.url)
        return ' '.join(texts), urls

    def tool_call(name: str, args: dict[str, Any]) -> dict[int, DeltaToolCall]:
        return {0: DeltaToolCall(name=name, json_args=compact(args), tool_call_id=f'call_{uuid.uuid4().hex[:24]}')}

    async def stream(messages: list[ModelMessage], info: AgentInfo):
        last = messages[-1]
        assert isinstance(last, ModelRequest)
        returns = [p for p in last.parts if isinstance(p, ToolReturnPart | RetryPromptPart)]
        if returns:
            part = returns[-1]
            content = part.content if isinstance(part, ToolReturnPart) else part.model_response()
            if part.tool_name == 'lookup':
                text = f'Lookup result: {compact(content)}'
            elif part.tool_name in ('remember', 'notes'):
                text = notes_text(content['notes'] if isinstance(content, dict) else [])
            elif part.tool_name == 'ask':
                denied = isinstance(part, ToolReturnPart) and part.outcome == 'denied'
                text = f'You cancelled: {content}' if denied else f'You answered: {payload_text(content)}'
            else:
                text = f'{part.tool_name}: {payload_text(content)}'
            for chunk in split_chunks(text):
                yield chunk
            return

        prompts = [p for p in last.parts if isinstance(p, UserPromptPart)]
        text, urls = user_text_and_urls(prompts[-1]) if prompts else ('', [])
        name, rest = command(text)
        if name == '/tool':
            yield tool_call('lookup', {'query': rest})
        elif name == '/remember':
            yield tool_call('remember', {'note': rest})
        elif name == '/notes':
            yield tool_call('notes', {})
        elif name == '/ask':
            yield tool_call('ask', {'question': rest})
        elif name == '/think':
            for chunk in split_chunks(f'Thinking about {rest}'):
                yield {0: DeltaThinkingPart(content=chunk)}
            for chunk in split_chunks(f'Thought about {rest}'):
                yield chunk
        elif name == '/slow':
            for chunk in slow_chunks():
                yield chunk
                await asyncio.sleep(SLOW_INTERVAL)
        elif name == '/file':
            for chunk in split_chunks(await describe_files(urls)):
                yield chunk
        elif name == '/fail':
            raise RuntimeError('requested failure (/fail)')
        else:
            for chunk in split_chunks(f'You said: {text} ({input_message_count()} messages)'):
                yield chunk

    agent = Agent(
        FunctionModel(stream_function=stream, model_name='switchboard-scripted'),
        deps_type=StateDeps[Notes],
        output_type=[str, DeferredToolRequests],
    )

    @agent.tool_plain
    def lookup(query: str) -> dict[str, Any]:
        """Look something up (deterministic)."""
        return lookup_result(query)

    @agent.tool
    def remember(ctx: RunContext[StateDeps[Notes]], note: str) -> ToolReturn:
        """Append a note to the shared state."""
        ctx.deps.state.notes.append(note)
        snapshot = ctx.deps.state.model_dump()
        return ToolReturn(
            return_value=snapshot,
            metadata=[StateSnapshotEvent(type=EventType.STATE_SNAPSHOT, snapshot=snapshot)],
        )

    @agent.tool
    def notes(ctx: RunContext[StateDeps[Notes]]) -> dict[str, Any]:
        """The notes in the shared state."""
        return ctx.deps.state.model_dump()

    @agent.tool_plain(requires_approval=True)
    def ask(question: str, answer: str | None = None) -> str:
        """Ask the user; runs once the interrupt is approved (editedArgs may carry an answer)."""
        return answer if answer is not None else 'approved'

    async def run(request: Request) -> Response:
        return await AGUIAdapter.dispatch_request(request, agent=agent, deps=StateDeps(Notes()))

    async def health(request: Request) -> Response:
        return JSONResponse({'status': 'ok', 'framework': 'pydantic'})

    return Starlette(routes=[Route('/', run, methods=['POST']), Route('/health', health, methods=['GET'])])


# --------------------------------------------------------------------------------------------
# LangGraph: ag-ui-langgraph's FastAPI endpoint over a graph of plain Python nodes; text and tool
# calls are streamed by a scripted chat model so the adapter sees real LangChain stream events.


def langgraph_app() -> Any:
    from ag_ui_langgraph import LangGraphAgent, add_langgraph_fastapi_endpoint
    from ag_ui_langgraph.interrupts import DEFAULT_RESUME_SENTINEL_CANCELLED as CANCELLED
    from fastapi import FastAPI
    from langchain_core.language_models.chat_models import BaseChatModel
    from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, HumanMessage, ToolMessage
    from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
    from langchain_core.tools import tool
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.graph import END, START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode
    from langgraph.types import interrupt

    class ScriptedChatModel(BaseChatModel):
        """Streams the given chunks (AIMessageChunk), `delay` seconds apart."""

        chunks: list[Any]
        delay: float = 0.0

        @property
        def _llm_type(self) -> str:
            return 'switchboard-scripted'

        def _generate(self, messages, stop=None, run_manager=None, **kwargs) -> ChatResult:
            message = self.chunks[0]
            for chunk in self.chunks[1:]:
                message = message + chunk
            return ChatResult(generations=[ChatGeneration(message=AIMessage(**message.model_dump(exclude={'type'})))])

        async def _astream(self, messages, stop=None, run_manager=None, **kwargs):
            for i, chunk in enumerate(self.chunks):
                if i and self.delay:
                    await asyncio.sleep(self.delay)
                generation = ChatGenerationChunk(message=chunk)
                if run_manager:
                    await run_manager.on_llm_new_token(chunk.content, chunk=generation)
                yield generation

    async def say(messages: list[BaseMessage], text_chunks: list[str], delay: float = 0.0) -> AIMessage:
        model = ScriptedChatModel(chunks=[AIMessageChunk(content=c) for c in text_chunks], delay=delay)
        return await model.ainvoke(messages)

    async def call_tool(messages: list[BaseMessage], name: str, args: dict[str, Any]) -> AIMessage:
        # Name and id first, then the arguments, as providers stream them: ag-ui-langgraph drops the
        # arguments of the chunk that opens a call (TOOL_CALL_START) from TOOL_CALL_ARGS.
        call_id = f'call_{uuid.uuid4().hex[:24]}'
        arguments = compact(args)
        chunks = [AIMessageChunk(content='', tool_call_chunks=[{'name': name, 'args': '', 'id': call_id, 'index': 0}])]
        chunks += [
            AIMessageChunk(content='', tool_call_chunks=[{'name': None, 'args': part, 'id': None, 'index': 0}])
            for part in split_chunks(arguments, 12)
        ]
        model = ScriptedChatModel(chunks=chunks)
        return await model.ainvoke(messages)

    @tool
    def lookup(query: str) -> dict[str, Any]:
        """Look something up (deterministic)."""
        return lookup_result(query)

    class State(MessagesState):
        notes: list[str]

    def text_and_urls(message: HumanMessage) -> tuple[str, list[str]]:
        if isinstance(message.content, str):
            return message.content, []
        texts, urls = [], []
        for block in message.content:
            if isinstance(block, str):
                texts.append(block)
            elif isinstance(block, dict):
                if block.get('type') == 'text':
                    texts.append(block.get('text', ''))
                url = block.get('url')
                if url is None and isinstance(block.get('image_url'), dict):
                    url = block['image_url'].get('url')
                if isinstance(url, str) and url.startswith(('http://', 'https://')):
                    urls.append(url)
        return ' '.join(texts), urls

    async def agent(state: State) -> dict[str, Any]:
        messages = state['messages']
        last = messages[-1] if messages else None
        if isinstance(last, ToolMessage):
            content = last.content
            try:
                content = json.loads(content) if isinstance(content, str) else content
            except ValueError:
                pass
            return {'messages': [await say(messages, split_chunks(f'Lookup result: {compact(content)}'))]}

        human = next((m for m in reversed(messages) if isinstance(m, HumanMessage)), None)
        text, urls = text_and_urls(human) if human else ('', [])
        name, rest = command(text)
        notes = list(state.get('notes') or [])
        if name == '/tool':
            return {'messages': [await call_tool(messages, 'lookup', {'query': rest})]}
        if name == '/remember':
            notes.append(rest)
            return {'notes': notes, 'messages': [await say(messages, split_chunks(notes_text(notes)))]}
        if name == '/notes':
            return {'messages': [await say(messages, split_chunks(notes_text(notes)))]}
        if name == '/ask':
            answer = interrupt({'reason': 'question', 'message': rest})
            if isinstance(answer, dict) and answer.get(CANCELLED):  # a ResumeEntry with status cancelled
                reply = 'You cancelled: the question was not answered'
            else:
                reply = f'You answered: {payload_text(answer)}'
            return {'messages': [await say(messages, split_chunks(reply))]}
        if name == '/think':
            # LangChain's standard reasoning content block, then the text.
            chunks = [
                AIMessageChunk(content=[{'type': 'reasoning', 'reasoning': part, 'index': 0}])
                for part in split_chunks(f'Thinking about {rest}')
            ]
            chunks += [
                AIMessageChunk(content=[{'type': 'text', 'text': part, 'index': 1}])
                for part in split_chunks(f'Thought about {rest}')
            ]
            return {'messages': [await ScriptedChatModel(chunks=chunks).ainvoke(messages)]}
        if name == '/slow':
            return {'messages': [await say(messages, slow_chunks(), delay=SLOW_INTERVAL)]}
        if name == '/file':
            return {'messages': [await say(messages, split_chunks(await describe_files(urls)))]}
        if name == '/fail':
            raise RuntimeError('requested failure (/fail)')
        reply = f'You said: {text} ({input_message_count()} messages)'
        return {'messages': [await say(messages, split_chunks(reply))]}

    def route(state: State) -> str:
        last = state['messages'][-1]
        return 'tools' if isinstance(last, AIMessage) and last.tool_calls else END

    builder = StateGraph(State)
    builder.add_node('agent', agent)
    builder.add_node('tools', ToolNode([lookup]))
    builder.add_edge(START, 'agent')
    builder.add_conditional_edges('agent', route, ['tools', END])
    builder.add_edge('tools', 'agent')
    graph = builder.compile(checkpointer=InMemorySaver())

    app = FastAPI()
    add_langgraph_fastapi_endpoint(
        app,
        LangGraphAgent(
            name='switchboard-scripted',
            graph=graph,
            # AG-UI 1.0 interrupts: RUN_FINISHED.outcome {type: interrupt}, resumed by RunAgentInput.resume.
            # Without these the adapter sends the legacy CUSTOM on_interrupt event and a plain RUN_FINISHED.
            emit_interrupt_outcome=True,
            enable_legacy_on_interrupt_event=False,
            # Otherwise every event carries the LangChain event it came from in `rawEvent`.
            emit_raw_events=False,
        ),
        '/',
    )
    return app


# --------------------------------------------------------------------------------------------


async def serve(app: Any, port: int) -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(('127.0.0.1', port))
    config = uvicorn.Config(
        app,
        log_config=None,
        log_level='warning',
        access_log=False,
        lifespan='off',
        timeout_graceful_shutdown=1,
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        if task.done():
            await task
            raise SystemExit('server stopped before it started')
        await asyncio.sleep(0.01)
    print(f'listening {sock.getsockname()[1]}', flush=True)
    await task


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--framework', choices=['pydantic', 'langgraph'], required=True)
    parser.add_argument('--port', type=int, default=0)
    parser.add_argument('--log', help='file to append `request <runId>` / `closed <runId>` lines to')
    args = parser.parse_args()
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING, format='%(levelname)s %(name)s: %(message)s')
    if args.log:
        open(args.log, 'a').close()
    app = pydantic_app() if args.framework == 'pydantic' else langgraph_app()
    asyncio.run(serve(RequestLog(app, args.log), args.port))


if __name__ == '__main__':
    main()
