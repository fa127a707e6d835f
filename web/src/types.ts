// Wire shapes of the Switchboard API that the client reads (README "API at a glance",
// docs/history.md) and the UiSchemaRenderer 2.0 of agent-run-input-protocol.md.
//
// A message's stored metadata, its files, tool calls and card hints, and the CUSTOM events the
// client shows, are generated from their Rust types (crates/protocol) into ./generated/ by
// ts-rs; a Rust test fails when those files differ from what the types generate now.

import type { AgentChatMessageMetadata } from "./generated/AgentChatMessageMetadata";
import type { GeneratedAttachments } from "./generated/GeneratedAttachments";
import type { UiHintsEvent } from "./generated/UiHintsEvent";
import type { UiStatus } from "./generated/UiStatus";
import type { UiTheme } from "./generated/UiTheme";

export type { AgentChatMessageMetadata } from "./generated/AgentChatMessageMetadata";
export type { AttachedFile } from "./generated/AttachedFile";
export type { GeneratedFile } from "./generated/GeneratedFile";
export type { StoredToolCall } from "./generated/StoredToolCall";
export type { UiHints } from "./generated/UiHints";
export type { UiStatus } from "./generated/UiStatus";
export type { UiTheme } from "./generated/UiTheme";
export type { UserMessageAttachments } from "./generated/UserMessageAttachments";

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
  /** The platform's fields, typed, and the agent's own (`[key: string]: any` in the seed). */
  metadata: AgentChatMessageMetadata & Record<string, unknown>;
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

/** UiSchemaRenderer 2.0: the compiled card the history serves and `ui_hints` compile to. */
export interface UiSchemaRenderer {
  version: "2.0";
  locale: string;
  status: UiStatus;
  theme: UiTheme;
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
  ui_hints: UiHintsEvent;
  /** Files the agent made, shown with a message. */
  attachments: GeneratedAttachments;
  /** A prompt's time ran out. */
  interaction_timeout: { promptId: string; error?: string };
}
