// The conversations, most recent first, a page at a time.

import type { ThreadSummary } from "../types";

interface Props {
  threads: ThreadSummary[];
  current: string | null;
  titles: Record<string, string>;
  hasMore: boolean;
  loading: boolean;
  error: string | null;
  onOpen: (threadId: string) => void;
  onMore: () => void;
}

function when(iso: string): string {
  const date = new Date(iso);
  const sameDay = date.toDateString() === new Date().toDateString();
  return sameDay
    ? date.toLocaleTimeString(undefined, { hour: "2-digit", minute: "2-digit" })
    : date.toLocaleDateString(undefined, { month: "short", day: "numeric", year: "numeric" });
}

function started(iso: string): string {
  return new Date(iso).toLocaleString(undefined, { month: "short", day: "numeric", hour: "2-digit", minute: "2-digit" });
}

export function Threads(props: Props) {
  const listed = props.threads.some((t) => t.threadId === props.current);
  return (
    <div class="threads">
      <ul class="thread-list">
        {props.current && !listed && (
          <li>
            <button type="button" class="thread current" aria-current="page">
              <span class="thread-title">{props.titles[props.current] ?? "New conversation"}</span>
              <span class="thread-meta">not sent yet</span>
            </button>
          </li>
        )}
        {props.threads.map((thread) => (
          <li key={thread.threadId}>
            <button
              type="button"
              class={`thread${thread.threadId === props.current ? " current" : ""}`}
              aria-current={thread.threadId === props.current ? "page" : undefined}
              data-thread={thread.threadId}
              onClick={() => props.onOpen(thread.threadId)}
            >
              <span class="thread-title">{props.titles[thread.threadId] ?? `Chat · ${started(thread.createdAt)}`}</span>
              <span class="thread-meta">
                {when(thread.updatedAt)} · {thread.messageCount} {thread.messageCount === 1 ? "message" : "messages"}
              </span>
            </button>
          </li>
        ))}
      </ul>
      {props.error && (
        <p class="field-error" role="alert">
          {props.error}
        </p>
      )}
      {props.hasMore && (
        <button type="button" class="quiet more" onClick={props.onMore} disabled={props.loading}>
          {props.loading ? "Loading…" : "More conversations"}
        </button>
      )}
    </div>
  );
}
