// A conversation's thread stream: `GET /api/v1/agent/threads/{threadId}/events` (SSE), which
// sends a MESSAGES_SNAPSHOT of the thread, then the events of its open run, then every later run
// on the thread, from any tab or device, live, and never ends by itself.
//
// A browser's EventSource cannot send the bearer token, so, like the run streams of agent.ts,
// the stream is read with fetch and the Authorization header. The SSE id of each event
// (`<taskId>:<seq>`, the snapshot's `<taskId>:0` or `0`) is kept, and a stream that breaks
// (network, gateway, server restart) is opened again with `Last-Event-ID`, which the server
// resumes exactly after that event (or answers with a fresh snapshot once that run is over).

import type { AGUIEvent } from "@ag-ui/client";

/** One event of the thread stream and its SSE id. */
export interface ThreadFrame {
  id: string | null;
  event: AGUIEvent;
}

/** Where the stream is: reading, broken (retrying), or the thread has nothing yet (404). */
export type FeedState = "open" | "down" | "missing";

export interface FeedHandlers {
  onFrame(frame: ThreadFrame): void;
  onState(state: FeedState): void;
  /** 401: the token is no longer accepted. The feed stops. */
  onUnauthorized(): void;
}

/** `<taskId>` of a run event's SSE id; null for the idle snapshot's `0`. */
export function taskOf(id: string | null): string | null {
  const colon = id?.indexOf(":") ?? -1;
  return colon > 0 ? id!.slice(0, colon) : null;
}

export class ThreadFeed {
  private readonly abort = new AbortController();
  /** The id of the last event read: where a reconnect resumes. */
  private lastEventId: string | null = null;
  private wake: (() => void) | null = null;
  private running = false;

  constructor(
    private readonly token: string,
    readonly threadId: string,
    private readonly handlers: FeedHandlers,
  ) {}

  /** Opens the stream and keeps it open until `stop`. */
  start(): void {
    if (this.running || this.abort.signal.aborted) return;
    this.running = true;
    void this.loop();
  }

  stop(): void {
    this.abort.abort();
    this.wake?.();
  }

  /** Tries again now instead of after the current wait (a run was just started here). */
  kick(): void {
    this.wake?.();
  }

  private async loop(): Promise<void> {
    const signal = this.abort.signal;
    const url = `/api/v1/agent/threads/${encodeURIComponent(this.threadId)}/events`;
    let attempt = 0;
    while (!signal.aborted) {
      let missing = false;
      try {
        const headers: Record<string, string> = { Authorization: `Bearer ${this.token}`, Accept: "text/event-stream" };
        if (this.lastEventId !== null) headers["Last-Event-ID"] = this.lastEventId;
        const response = await fetch(url, { headers, signal, cache: "no-store" });
        if (response.status === 401) {
          this.handlers.onUnauthorized();
          return;
        }
        if (response.status === 400 && this.lastEventId !== null) {
          // A position the server no longer knows: start again from a snapshot.
          await response.body?.cancel();
          this.lastEventId = null;
          continue;
        }
        if (response.status === 404) {
          missing = true;
          await response.body?.cancel();
        } else if (response.ok && response.body) {
          this.handlers.onState("open");
          if (await this.read(response.body)) attempt = 0;
        } else {
          await response.body?.cancel();
        }
      } catch {
        // The connection broke: reconnect below, unless the feed was stopped.
      }
      if (signal.aborted) return;
      this.handlers.onState(missing ? "missing" : "down");
      attempt += 1;
      // An empty thread is asked about again rarely (a run started here kicks the feed).
      await this.pause(missing ? Math.min(2000 * 2 ** (attempt - 1), 30_000) : Math.min(500 * 2 ** (attempt - 1), 8000));
    }
  }

  /** Reads SSE frames until the stream ends or breaks; true if at least one event came. */
  private async read(body: ReadableStream<Uint8Array>): Promise<boolean> {
    const reader = body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    let received = false;
    try {
      for (;;) {
        const { done, value } = await reader.read();
        if (done) return received;
        buffer += decoder.decode(value, { stream: true }).replace(/\r\n?/g, "\n");
        let end: number;
        while ((end = buffer.indexOf("\n\n")) >= 0) {
          const block = buffer.slice(0, end);
          buffer = buffer.slice(end + 2);
          if (this.dispatch(block)) received = true;
        }
      }
    } finally {
      reader.releaseLock();
    }
  }

  /** One SSE block: its `id` and `data` fields (comments, such as heartbeats, are skipped). */
  private dispatch(block: string): boolean {
    let id: string | null = null;
    const data: string[] = [];
    for (const line of block.split("\n")) {
      if (line === "" || line.startsWith(":")) continue;
      const colon = line.indexOf(":");
      const field = colon < 0 ? line : line.slice(0, colon);
      let value = colon < 0 ? "" : line.slice(colon + 1);
      if (value.startsWith(" ")) value = value.slice(1);
      if (field === "id") id = value;
      else if (field === "data") data.push(value);
    }
    if (id !== null) this.lastEventId = id;
    if (data.length === 0) return false;
    let event: unknown;
    try {
      event = JSON.parse(data.join("\n"));
    } catch {
      return false;
    }
    if (!isEvent(event)) return false;
    this.handlers.onFrame({ id, event });
    return true;
  }

  /** Waits `ms` (while the browser is offline: until it is back online), or until `kick`/`stop`. */
  private pause(ms: number): Promise<void> {
    return new Promise((resolve) => {
      const done = () => {
        clearTimeout(timer);
        window.removeEventListener("online", done);
        this.wake = null;
        resolve();
      };
      const timer = navigator.onLine ? setTimeout(done, ms) : undefined;
      window.addEventListener("online", done);
      this.wake = done;
    });
  }
}

/** An AG-UI event as the server sends it: an object with a string `type`. */
function isEvent(value: unknown): value is AGUIEvent {
  return typeof value === "object" && value !== null && typeof (value as { type?: unknown }).type === "string";
}
