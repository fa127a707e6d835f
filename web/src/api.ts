// The Switchboard HTTP API, same origin as the page (the gateway), with the bearer token.

import type {
  DownloadUrlAnswer,
  ErrorEnvelope,
  HistoryDay,
  ThreadForkRequest,
  ThreadPage,
  ThreadSearchPage,
  ThreadSummary,
  UploadUrlAnswer,
} from "./types";

/** An answer that was not 2xx, with the envelope's code, message and field. */
export class ApiError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
    readonly field?: string,
  ) {
    super(message);
  }
}

/** The browser's IANA time zone, so history days are the user's days. */
export function timeZone(): string | undefined {
  try {
    return Intl.DateTimeFormat().resolvedOptions().timeZone || undefined;
  } catch {
    return undefined;
  }
}

export class Api {
  constructor(
    readonly token: string,
    private readonly onUnauthorized: () => void,
  ) {}

  get authHeader(): Record<string, string> {
    return { Authorization: `Bearer ${this.token}` };
  }

  async request<T>(
    method: string,
    path: string,
    options: { query?: Record<string, string | undefined>; body?: unknown } = {},
  ): Promise<T> {
    const url = new URL(path, location.origin);
    for (const [name, value] of Object.entries(options.query ?? {})) {
      if (value !== undefined) url.searchParams.set(name, value);
    }
    const headers: Record<string, string> = { ...this.authHeader };
    if (options.body !== undefined) headers["Content-Type"] = "application/json";
    const response = await fetch(url, {
      method,
      headers,
      body: options.body === undefined ? undefined : JSON.stringify(options.body),
    });
    const text = await response.text();
    let json: unknown = null;
    try {
      json = text ? JSON.parse(text) : null;
    } catch {
      json = null;
    }
    if (!response.ok) {
      if (response.status === 401) this.onUnauthorized();
      const envelope = (json as ErrorEnvelope | null)?.error;
      throw new ApiError(
        response.status,
        envelope?.code ?? "http_error",
        envelope?.message ?? `${method} ${path} answered ${response.status}`,
        envelope?.field,
      );
    }
    return json as T;
  }

  threads(cursor?: string | null, limit = 20): Promise<ThreadPage> {
    return this.request("GET", "/api/v1/agent/threads", {
      query: { limit: String(limit), cursor: cursor ?? undefined },
    });
  }

  /** The caller's threads with a message matching `q` (400 when `q` has nothing to look for or is over 256 characters). */
  searchThreads(q: string, cursor?: string | null, limit = 20): Promise<ThreadSearchPage> {
    return this.request("GET", "/api/v1/agent/threads", {
      query: { q, limit: String(limit), cursor: cursor ?? undefined },
    });
  }

  /** Gives a thread a title (400 naming `/title` when empty or over 200 characters); answers it as the list shows it. */
  renameThread(threadId: string, title: string): Promise<ThreadSummary> {
    return this.request("PATCH", `/api/v1/agent/threads/${encodeURIComponent(threadId)}`, { body: { title } });
  }

  /** Erases a thread (204; 404 when the caller has no such thread; 503 may be retried, it is idempotent). */
  async deleteThread(threadId: string): Promise<void> {
    await this.request<null>("DELETE", `/api/v1/agent/threads/${encodeURIComponent(threadId)}`);
  }

  /**
   * A new thread holding the messages of `threadId` up to and with `messageId` (201, the new
   * thread as the list shows it); 404 when the caller has no such thread, 422 naming
   * `/messageId` when it holds no such message, 503 may be retried.
   */
  forkThread(threadId: string, messageId: string): Promise<ThreadSummary> {
    const body: ThreadForkRequest = { messageId };
    return this.request("POST", `/api/v1/agent/threads/${encodeURIComponent(threadId)}/fork`, { body });
  }

  /** The latest page of the latest day (before `before`), or the page a day's `cursor` continues. */
  historyDay(threadId: string, before?: string | null, cursor?: string | null): Promise<HistoryDay> {
    return this.request("GET", "/api/v1/agent/history/blocks", {
      query: { threadId, before: before ?? undefined, cursor: cursor ?? undefined, tz: timeZone() },
    });
  }

  uploadUrl(body: {
    file_name: string;
    file_type: string;
    file_size: number;
    content_hash: string;
    session_id?: string;
  }): Promise<UploadUrlAnswer> {
    return this.request("POST", "/v2/files/upload-url", { body });
  }

  downloadUrl(contentUrl: string): Promise<DownloadUrlAnswer> {
    return this.request("GET", "/v2/files/download-url", { query: { content_url: contentUrl } });
  }

  cancelRun(runId: string): Promise<unknown> {
    return this.request("POST", `/api/v1/agent/runs/${encodeURIComponent(runId)}/cancel`);
  }
}
