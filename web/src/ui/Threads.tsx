// The conversations, most recent first, a page at a time; a search over them (its hits with the
// matching text highlighted); renaming one in place and deleting one after a confirmation.

import { useEffect, useId, useLayoutEffect, useRef, useState } from "preact/hooks";

import type { SearchState } from "../chat";
import { snippetParts } from "../snippet";
import type { ThreadSearchHit, ThreadSummary } from "../types";

interface Props {
  threads: ThreadSummary[];
  current: string | null;
  titles: Record<string, string>;
  hasMore: boolean;
  loading: boolean;
  error: string | null;
  search: SearchState;
  onOpen: (threadId: string) => void;
  onMore: () => void;
  onSearch: (text: string) => void;
  onMoreResults: () => void;
  onOpenHit: (hit: ThreadSearchHit) => void;
  /** Resolves once renamed; rejects with the server's refusal. */
  onRename: (threadId: string, title: string) => Promise<void>;
  /** Resolves once deleted; rejects when it could not be (it may be tried again). */
  onDelete: (threadId: string) => Promise<void>;
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

/** A hit's day, a UTC date: shown as that date wherever the reader is. */
function hitDay(day: string): string {
  const date = new Date(`${day}T12:00:00Z`);
  return Number.isNaN(date.getTime()) ? day : date.toLocaleDateString(undefined, { month: "short", day: "numeric", year: "numeric", timeZone: "UTC" });
}

function messageOf(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}

/** A snippet as text and <mark> elements: its HTML is never injected (see snippet.ts). */
function Snippet({ text }: { text: string }) {
  return <>{snippetParts(text).map((part, i) => (part.marked ? <mark key={i}>{part.text}</mark> : part.text))}</>;
}

function PencilIcon() {
  return (
    <svg aria-hidden="true" width="18" height="18" viewBox="0 0 24 24" fill="none" stroke="currentColor" stroke-width="2" stroke-linecap="round" stroke-linejoin="round">
      <path d="M12 20h9" />
      <path d="M16.5 3.5a2.1 2.1 0 0 1 3 3L7 19l-4 1 1-4Z" />
    </svg>
  );
}

function TrashIcon() {
  return (
    <svg aria-hidden="true" width="18" height="18" viewBox="0 0 24 24" fill="none" stroke="currentColor" stroke-width="2" stroke-linecap="round" stroke-linejoin="round">
      <path d="M3 6h18" />
      <path d="M8 6V4h8v2" />
      <path d="M19 6l-1 14H6L5 6" />
    </svg>
  );
}

/** The title field that takes a thread's place while it is renamed: Enter saves, Escape cancels. */
function RenameForm({ title, onSave, onDone }: { title: string; onSave: (title: string) => Promise<void>; onDone: () => void }) {
  const [draft, setDraft] = useState(title);
  const [error, setError] = useState<string | null>(null);
  const [saving, setSaving] = useState(false);
  const input = useRef<HTMLInputElement>(null);
  const errorId = useId();
  useLayoutEffect(() => {
    input.current?.focus();
    input.current?.select();
  }, []);
  const submit = async (event: Event) => {
    event.preventDefault();
    if (saving) return;
    setSaving(true);
    setError(null);
    try {
      await onSave(draft);
      onDone();
    } catch (err) {
      // The server's words: "title must not be empty", "... at most 200 characters", ...
      setSaving(false);
      setError(messageOf(err));
      input.current?.focus();
    }
  };
  return (
    <form class="rename" onSubmit={submit} aria-busy={saving ? "true" : undefined}>
      <input
        ref={input}
        class="rename-input"
        aria-label="New title"
        value={draft}
        readOnly={saving}
        aria-invalid={error ? "true" : undefined}
        aria-describedby={error ? errorId : undefined}
        onInput={(e) => setDraft(e.currentTarget.value)}
        onKeyDown={(e) => {
          if (e.key !== "Escape") return;
          // Only the edit ends: the drawer (which also closes on Escape) stays.
          e.preventDefault();
          e.stopPropagation();
          if (!saving) onDone();
        }}
      />
      <div class="row-actions">
        <button type="submit" class="primary" disabled={saving}>
          {saving ? "Saving…" : "Save"}
        </button>
        <button type="button" class="quiet" disabled={saving} onClick={onDone}>
          Cancel
        </button>
      </div>
      {error && (
        <p id={errorId} class="field-error" role="alert">
          {error}
        </p>
      )}
    </form>
  );
}

/** The confirmation a delete asks for, under the thread; Cancel has the focus, Escape cancels. */
function ConfirmDelete({ title, onDelete, onDone }: { title: string; onDelete: () => Promise<void>; onDone: () => void }) {
  const [error, setError] = useState<string | null>(null);
  const [busy, setBusy] = useState(false);
  const cancel = useRef<HTMLButtonElement>(null);
  const id = useId();
  useLayoutEffect(() => cancel.current?.focus(), []);
  const confirm = async () => {
    if (busy) return;
    setBusy(true);
    setError(null);
    try {
      await onDelete(); // the row goes with the thread
    } catch (err) {
      setBusy(false);
      setError(`Could not delete it: ${messageOf(err)}`);
    }
  };
  return (
    <div
      class="confirm"
      role="alertdialog"
      aria-labelledby={`${id}-q`}
      aria-describedby={`${id}-d`}
      onKeyDown={(e) => {
        if (e.key !== "Escape") return;
        e.preventDefault();
        e.stopPropagation();
        if (!busy) onDone();
      }}
    >
      <p id={`${id}-q`} class="confirm-question">
        Delete “{title}”?
      </p>
      <p id={`${id}-d`} class="confirm-detail">
        Its messages and files are erased for good.
      </p>
      {error && (
        <p class="field-error" role="alert">
          {error}
        </p>
      )}
      <div class="row-actions">
        {/* aria-disabled, not disabled: the focus stays in the confirmation while it waits. */}
        <button type="button" class="danger" aria-disabled={busy ? "true" : undefined} onClick={() => void confirm()}>
          {busy ? "Deleting…" : error ? "Try again" : "Delete"}
        </button>
        <button type="button" class="quiet" ref={cancel} aria-disabled={busy ? "true" : undefined} onClick={() => !busy && onDone()}>
          Cancel
        </button>
      </div>
    </div>
  );
}

function SearchResults(props: Props) {
  const { query, hits, cursor, loading, error } = props.search;
  let status = "";
  if (hits === null) status = loading ? "Searching…" : "";
  else if (hits.length === 0) status = loading ? "Searching…" : `No conversation matches “${query.trim()}”.`;
  else status = `${hits.length}${cursor ? "+" : ""} ${hits.length === 1 ? "conversation" : "conversations"} found`;
  return (
    <div class="search-results" aria-busy={loading ? "true" : undefined}>
      {status && <p class="search-status">{status}</p>}
      {error && (
        <p id="thread-search-error" class="field-error" role="alert">
          {error}
        </p>
      )}
      {hits && hits.length > 0 && (
        <ul class="thread-list" aria-label="Search results">
          {hits.map((hit) => (
            <li key={hit.threadId}>
              <button
                type="button"
                class={`thread search-hit${hit.threadId === props.current ? " current" : ""}`}
                aria-current={hit.threadId === props.current ? "page" : undefined}
                data-hit={hit.threadId}
                onClick={() => props.onOpenHit(hit)}
              >
                <span class="thread-title">{hit.title ?? props.titles[hit.threadId] ?? "Untitled conversation"}</span>
                <span class="hit-snippet">
                  <Snippet text={hit.snippet} />
                </span>
                <span class="thread-meta">{hitDay(hit.day)}</span>
              </button>
            </li>
          ))}
        </ul>
      )}
      {cursor && (
        <button type="button" class="quiet more-results" onClick={props.onMoreResults} disabled={loading}>
          {loading ? "Loading…" : "More results"}
        </button>
      )}
    </div>
  );
}

export function Threads(props: Props) {
  const listed = props.threads.some((t) => t.threadId === props.current);
  const searching = props.search.query.trim() !== "";
  // One thread at a time is renamed or asked about.
  const [editing, setEditing] = useState<{ threadId: string; mode: "rename" | "delete" } | null>(null);
  const root = useRef<HTMLDivElement>(null);
  // Where the focus goes once a rename or delete is over (the row's controls are gone).
  const focusNext = useRef<string | null>(null);
  useEffect(() => {
    const selector = focusNext.current;
    if (!selector) return;
    focusNext.current = null;
    (root.current?.querySelector<HTMLElement>(selector) ?? root.current?.querySelector<HTMLElement>("#thread-search"))?.focus();
  });
  const done = (threadId: string) => {
    focusNext.current = `.thread[data-thread="${CSS.escape(threadId)}"]`;
    setEditing(null);
  };
  const remove = async (threadId: string) => {
    const at = props.threads.findIndex((t) => t.threadId === threadId);
    const next = props.threads[at + 1] ?? props.threads[at - 1];
    await props.onDelete(threadId);
    focusNext.current = next ? `.thread[data-thread="${CSS.escape(next.threadId)}"]` : "#thread-search";
    setEditing(null);
  };
  const titleOf = (thread: ThreadSummary) => thread.title ?? props.titles[thread.threadId] ?? `Chat · ${started(thread.createdAt)}`;

  return (
    <div class="threads" ref={root}>
      <form class="thread-search" role="search" onSubmit={(e) => e.preventDefault()}>
        <label for="thread-search" class="visually-hidden">
          Search conversations
        </label>
        <input
          id="thread-search"
          type="search"
          placeholder="Search conversations"
          autocomplete="off"
          spellcheck={false}
          value={props.search.query}
          aria-invalid={props.search.error ? "true" : undefined}
          aria-describedby={props.search.error ? "thread-search-error" : undefined}
          onInput={(e) => props.onSearch(e.currentTarget.value)}
          onKeyDown={(e) => {
            if (e.key !== "Escape" || !props.search.query) return;
            // Escape empties the box first; a second one closes the drawer.
            e.preventDefault();
            e.stopPropagation();
            props.onSearch("");
          }}
        />
      </form>
      {searching ? (
        <SearchResults {...props} />
      ) : (
        <>
          <ul class="thread-list">
            {props.current && !listed && (
              <li>
                <button type="button" class="thread current" aria-current="page">
                  <span class="thread-title">{props.titles[props.current] ?? "New conversation"}</span>
                  <span class="thread-meta">not sent yet</span>
                </button>
              </li>
            )}
            {props.threads.map((thread) => {
              const title = titleOf(thread);
              const mode = editing?.threadId === thread.threadId ? editing.mode : null;
              return (
                <li key={thread.threadId} class="thread-row" data-thread-row={thread.threadId}>
                  {mode === "rename" ? (
                    <RenameForm title={title} onSave={(t) => props.onRename(thread.threadId, t)} onDone={() => done(thread.threadId)} />
                  ) : (
                    <button
                      type="button"
                      class={`thread${thread.threadId === props.current ? " current" : ""}`}
                      aria-current={thread.threadId === props.current ? "page" : undefined}
                      data-thread={thread.threadId}
                      onClick={() => props.onOpen(thread.threadId)}
                    >
                      <span class="thread-title">{title}</span>
                      <span class="thread-meta">
                        {when(thread.updatedAt)} · {thread.messageCount} {thread.messageCount === 1 ? "message" : "messages"}
                      </span>
                    </button>
                  )}
                  {mode === null && (
                    <div class="thread-actions">
                      <button
                        type="button"
                        class="quiet thread-action rename-thread"
                        aria-label={`Rename “${title}”`}
                        title="Rename"
                        onClick={() => setEditing({ threadId: thread.threadId, mode: "rename" })}
                      >
                        <PencilIcon />
                      </button>
                      <button
                        type="button"
                        class="quiet thread-action delete-thread"
                        aria-label={`Delete “${title}”`}
                        title="Delete"
                        onClick={() => setEditing({ threadId: thread.threadId, mode: "delete" })}
                      >
                        <TrashIcon />
                      </button>
                    </div>
                  )}
                  {mode === "delete" && <ConfirmDelete title={title} onDelete={() => remove(thread.threadId)} onDone={() => done(thread.threadId)} />}
                </li>
              );
            })}
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
        </>
      )}
    </div>
  );
}
