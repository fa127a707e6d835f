// Wire shapes of the Switchboard API that the client reads (README "API at a glance",
// docs/history.md) and the UiSchemaRenderer 2.0 of agent-run-input-protocol.md.

/** The one JSON error envelope of every service. */
export interface ErrorEnvelope {
  error: { code: string; message: string; field?: string };
}

/**
 * A thread as `GET /api/v1/agent/threads` lists it (and `PATCH .../threads/{threadId}` and
 * `POST .../threads/{threadId}/fork` answer it).
 */
export interface ThreadSummary {
  threadId: string;
  /** Given by its owner, else derived from its first user message; null until it has one. */
  title: string | null;
  messageCount: number;
  createdAt: string;
  updatedAt: string;
}

/** `POST /api/v1/agent/threads/{threadId}/fork`'s body: the last message the new thread holds. */
export interface ThreadForkRequest {
  messageId: string;
}

export interface ThreadPage {
  threads: ThreadSummary[];
  nextCursor: string | null;
}

/** A thread found by `GET /api/v1/agent/threads?q=`, with its best matching message. */
export interface ThreadSearchHit {
  threadId: string;
  title: string | null;
  updatedAt: string;
  /** The best matching message. */
  messageId: string;
  /** The day (UTC, `YYYY-MM-DD`) that message was written. */
  day: string;
  /** Text around the match, HTML-escaped, each match in `<mark>`…`</mark>`: see snippet.ts. */
  snippet: string;
}

/** `GET /api/v1/agent/threads?q=`: the best matches first. */
export interface ThreadSearchPage {
  threads: ThreadSearchHit[];
  nextCursor: string | null;
}

/** A block of `GET /api/v1/agent/history/blocks`. */
export type HistoryBlock =
  | { type: "text"; text: string }
  | { type: "binary"; mimeType?: string; url: string | null; filename?: string }
  | { type: string; [key: string]: unknown };

/** A file of a user message, as history keeps it in `metadata`. */
export interface StoredAttachment {
  bucket: string;
  path: string;
  mime_type: string;
  file_name?: string;
  size_bytes?: number;
}

/** A file the agent made (`CUSTOM attachments`, `metadata.attachments`). */
export interface GeneratedFile {
  path: string;
  filename: string;
  icon_type?: string;
  source?: string;
  content_url?: string;
}

export interface HistoryToolCall {
  id: string;
  type: "function";
  function: { name: string; arguments: string };
}

export interface HistoryMessage {
  id: string;
  seq: number;
  role: "user" | "assistant" | "tool" | "system" | string;
  content: HistoryBlock[];
  metadata: {
    run_id?: string;
    user_message_attachments?: StoredAttachment;
    user_message_attachment_list?: StoredAttachment[];
    attachments?: GeneratedFile[];
    tool_name?: string;
    /** A reply asked again: the id of the run whose reply replaced this message (kept as a previous version). */
    superseded_by?: string;
    /** A reply asked again: the id of the user message whose earlier reply this one replaced. */
    regenerates?: string;
    /** A message copied into a fork: the thread it was copied from. */
    forked_from?: { threadId: string };
    [key: string]: unknown;
  };
  uiSchema?: UiSchemaRenderer | null;
  toolCalls?: HistoryToolCall[];
  toolCallId?: string;
  timestamp: string;
}

/**
 * `GET /api/v1/agent/history/blocks`: a page of one day of a thread, its latest messages first
 * (up to 200 and 4 MiB); `nextCursor` continues the same day with its earlier messages.
 */
export interface HistoryDay {
  scope: "history_day";
  threadId: string | null;
  day: string | null;
  /** Earlier messages exist: more of this day (`nextCursor`) or earlier days (`before`). */
  hasMore: boolean;
  nextCursor?: string;
  messages: HistoryMessage[];
}

/** `POST /v2/files/upload-url`. */
export interface UploadUrlAnswer {
  url: string | null;
  fields: Record<string, string> | null;
  content_url: string;
  is_duplicate: boolean;
  upload_required: boolean;
}

/** `GET /v2/files/download-url`. */
export interface DownloadUrlAnswer {
  url: string;
  expires_in: number;
  content_type: string;
  file_name: string;
  file_size: number;
}

export type UiStatus = "info" | "success" | "warning" | "error" | "pending";

/** UiSchemaRenderer 2.0: the compiled card the history serves and `ui_hints` compile to. */
export interface UiSchemaRenderer {
  version: "2.0";
  locale: string;
  status: UiStatus;
  theme: "default" | "light" | "dark";
  meta?: Record<string, string>;
  root: UiNode;
}

export type UiNode =
  | { type: "stack"; appearance?: string; children: UiNode[] }
  | { type: "text"; content: string; role?: "title" | "body" | "caption" | string }
  | { type: "badge"; label: string; status?: UiStatus }
  | { type: "keyValue"; items: { label: string; value: string }[] }
  | { type: "list"; items: UiNode[] }
  | { type: "link"; label: string; href: string }
  | { type: string; [key: string]: unknown };

/** The agent's `ui_hints` (CUSTOM event), before compilation. */
export interface UiHints {
  title?: string;
  status?: UiStatus;
  badge?: string;
  body?: string;
  fields?: { label: string; value: string }[];
  items?: string[];
  links?: { label: string; href: string }[];
  locale?: string;
  theme?: "default" | "light" | "dark";
}

/** A prompt option (websocket-message-schema.md). */
export interface PromptOption {
  id: string;
  label: string;
  value: string;
  description?: string;
}

/** The prompt an interrupt carries in `metadata.prompt`. */
export interface Prompt {
  input_type: "text" | "binary_choice" | "radio" | "checkbox" | "dropdown";
  text: string;
  placeholder?: string;
  options?: PromptOption[];
  required?: boolean;
  timeout?: number | null;
  error?: string;
}

/** AG-UI 1.0's interrupt as Switchboard sends it. */
export interface PromptInterrupt {
  id: string;
  reason?: string;
  message?: string;
  responseSchema?: unknown;
  expiresAt?: string;
  metadata?: { prompt?: Prompt };
}

/** The values of the CUSTOM events the client shows, by event name. */
export interface CustomValues {
  /** Card hints for a message (or a tool result's message). */
  ui_hints: { messageId: string; hints: UiHints };
  /** Files the agent made, shown with a message. */
  attachments: { messageId: string; files: GeneratedFile[] };
  /** A prompt's time ran out. */
  interaction_timeout: { promptId: string; error?: string };
}
