// AG-UI's own HttpAgent, pointed at Switchboard's AG-UI route, with two additions a chat that
// survives network drops and reloads needs:
//  - every SSE event's `id` (the run's event number) is read as the bytes pass, so the client
//    always knows the last event it applied;
//  - `connect` (AG-UI's hook for joining a run already under way) follows
//    `GET /api/v1/agent/runs/{runId}/events` with `Last-Event-ID`, which resumes exactly after
//    that event. The events before the cursor are not sent again, so the stream is prefixed
//    with the openers the client already applied (RUN_STARTED, TEXT_MESSAGE_START,
//    TOOL_CALL_START) for AG-UI's event verifier; those carry no number and are not re-applied.

import { HttpAgent, runHttpRequest, transformHttpEventStream } from "@ag-ui/client";
import type { AgentSubscriber, BaseEvent, RunAgentInput, RunAgentResult } from "@ag-ui/client";
import type { RunAgentParameters } from "@ag-ui/client";
import { concat, from, type Observable } from "rxjs";

/** Where to join a run: its id, the last event applied, and the openers to replay. */
export interface ResumePoint {
  runId: string;
  after: number;
  openers: BaseEvent[];
}

export const AGUI_ROUTE = "/api/v1/agent/ag-ui";

export class SwitchboardAgent extends HttpAgent {
  /** Numbers of complete events read from the current stream, not yet handed out. */
  private ids: number[] = [];
  /** Synthetic openers at the head of the current stream (they have no number). */
  private synthetic = 0;
  private point: ResumePoint | null = null;
  /** The server answered 204: the cursor is at the end of a finished run. */
  endedBeforeResume = false;

  constructor(token: string, threadId: string) {
    const self: { agent?: SwitchboardAgent } = {};
    super({
      url: AGUI_ROUTE,
      threadId,
      headers: { Authorization: `Bearer ${token}` },
      fetch: (url, init) => self.agent!.numberedFetch(url, init),
    });
    self.agent = this;
  }

  /** The number of the event the subscriber is handed now; null for a synthetic opener. */
  nextEventNumber(): number | null {
    if (this.synthetic > 0) {
      this.synthetic -= 1;
      return null;
    }
    return this.ids.shift() ?? null;
  }

  /** Starts a run on the AG-UI route (a new user turn, or `resume` answering an interrupt). */
  start(parameters: RunAgentParameters, subscriber: AgentSubscriber): Promise<RunAgentResult> {
    this.ids = [];
    this.synthetic = 0;
    this.endedBeforeResume = false;
    return this.runAgent(parameters, subscriber);
  }

  /** Joins a run from `point.after` on. */
  async follow(point: ResumePoint, subscriber: AgentSubscriber): Promise<RunAgentResult> {
    this.point = point;
    this.ids = [];
    this.synthetic = point.openers.length;
    this.endedBeforeResume = false;
    try {
      return await this.connectAgent({ runId: point.runId }, subscriber);
    } finally {
      this.point = null;
    }
  }

  override connect(_input: RunAgentInput): Observable<BaseEvent> {
    const point = this.point!;
    this.abortController = new AbortController();
    const headers: Record<string, string> = { ...this.headers, Accept: "text/event-stream" };
    if (point.after > 0) headers["Last-Event-ID"] = String(point.after);
    const url = `/api/v1/agent/runs/${encodeURIComponent(point.runId)}/events`;
    const events = transformHttpEventStream(
      runHttpRequest(() => this.fetch(url, { method: "GET", headers, signal: this.abortController.signal })),
    );
    return concat(from(point.openers), events);
  }

  /** fetch, with the SSE `id` of every complete event noted in order as the bytes pass. */
  private async numberedFetch(url: string, init: RequestInit): Promise<Response> {
    const response = await fetch(url, init);
    if (response.status === 204) {
      this.endedBeforeResume = true;
      return new Response("", { status: 200, headers: { "Content-Type": "text/event-stream" } });
    }
    if (!response.ok || response.body === null) return response;
    const ids = this.ids;
    const decoder = new TextDecoder();
    let buffer = "";
    const numbered = response.body.pipeThrough(
      new TransformStream<Uint8Array, Uint8Array>({
        transform(chunk, controller) {
          buffer += decoder.decode(chunk, { stream: true }).replace(/\r\n?/g, "\n");
          const frames = buffer.split("\n\n");
          buffer = frames.pop() ?? "";
          for (const frame of frames) {
            const id = /^id: ?(\d+)$/m.exec(frame);
            if (id && /^data:/m.test(frame)) ids.push(Number(id[1]));
          }
          controller.enqueue(chunk);
        },
      }),
    );
    return new Response(numbered, { status: response.status, statusText: response.statusText, headers: response.headers });
  }
}
