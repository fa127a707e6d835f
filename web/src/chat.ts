// The chat's state and everything that changes it: sign-in, the thread list, history day by
// day, uploads, runs streamed through AG-UI's HttpAgent (resumed after a drop or a reload),
// prompts and their answers, the runs other tabs and devices start on the open conversation
// (its thread stream, thread.ts), the conversations' search, rename and delete, and, on messages,
// asking for a reply again (its previous versions kept, versions.ts) and branching a new
// conversation from one. The view (ui/) only reads `state`, `items` and `rows` and calls these
// methods. What one AG-UI event does to the conversation's items is events.ts (a pure reducer).
//
// Nothing shows twice. A run started in this tab (or joined after a reload) is streamed from its
// own request (the AG-UI POST, or `runs/{runId}/events` with Last-Event-ID): its id is in
// `ownRuns` before the request goes, and the thread stream's events of that run are dropped (the
// thread stream's ids are `<taskId>:<seq>`; the task's run id comes with its RUN_STARTED or
// RUN_FINISHED). Every other run of the thread is applied from the thread stream, from its
// RUN_STARTED (whose input carries the user's message) on; a run replayed from its start after
// a fresh snapshot replaces what was shown of it. History and the live items share message
// ids: a message or a run the live items show is left out of the history shown (`items`).

import { buildResumeArray, EventType } from "@ag-ui/client";
import type { AGUIEvent, AgentSubscriber, ContentPart, Interrupt, Message, RunAgentInput, RunStartedEvent } from "@ag-ui/client";
import type { RunAgentParameters } from "@ag-ui/client";

import { SwitchboardAgent, type ResumePoint } from "./agent";
import { Api, ApiError } from "./api";
import { applyEvent, generatedFile, isProtocolEvent, openers, type ChatItem, type FileRef, type PromptState, type Step } from "./events";
import { session, tokenFromFragment } from "./session";
import { taskOf, ThreadFeed, type FeedState, type ThreadFrame } from "./thread";
import type { AttachedFile, HistoryDay, HistoryMessage, PromptInterrupt, ThreadSearchHit, ThreadSummary } from "./types";
import { checkSelection, FILE_TYPES, uploadError, uploadFile, type UploadPhase } from "./upload";
import { versionOf, versionRows, type Row } from "./versions";

export type { ChatItem, FileRef, PromptState, Step } from "./events";

/** A run this tab follows: the last event it applied and whether the run is over. */
interface RunState {
  runId: string;
  cursor: number;
  started: boolean;
  terminal: boolean;
  /** A run the server starts itself (a prompt's timeout): 404 until it exists. */
  awaited?: boolean;
}

/** What the tab keeps (sessionStorage) about a thread's runs since the last settled one. */
interface Live {
  threadId: string;
  /** The runs this tab streams itself (their items are kept; runs from elsewhere are not). */
  runIds: string[];
  items: ChatItem[];
  run: RunState | null;
  /** The user message whose reply `run` asks for again (its previous reply is a previous version). */
  supersedes?: string;
}

export interface Draft {
  id: string;
  file: File;
  type: string;
  phase: UploadPhase;
}

export type RunStatus = "sending" | "streaming" | "reconnecting" | "stopping" | null;

/** The search over the conversations: the box's text and what the server found for it. */
export interface SearchState {
  /** As typed; blank: no search, the thread list shows. */
  query: string;
  /** The threads found, best first; null until the first page for `query` came. */
  hits: ThreadSearchHit[] | null;
  cursor: string | null;
  loading: boolean;
  /** The server's message for a refused query (400), or why the search failed. */
  error: string | null;
}

const NO_SEARCH: SearchState = { query: "", hits: null, cursor: null, loading: false, error: null };
/** Typing pauses this long before a search goes. */
const SEARCH_DEBOUNCE_MS = 250;
/** Most earlier pages loaded to reach a message found by a search. */
const REVEAL_PAGES = 30;

export interface ViewState {
  token: string | null;
  signInError: string | null;
  threads: ThreadSummary[];
  threadsCursor: string | null;
  threadsLoading: boolean;
  threadsError: string | null;
  titles: Record<string, string>;
  threadId: string | null;
  history: ChatItem[];
  oldestDay: string | null;
  /** Continues the oldest day shown when only part of it is (a long day comes in pages). */
  dayCursor: string | null;
  hasMore: boolean;
  historyLoading: boolean;
  historyError: string | null;
  live: ChatItem[];
  runStatus: RunStatus;
  drafts: Draft[];
  composerErrors: string[];
  announcement: string;
  search: SearchState;
  /** The key of the message a search hit led to, shown highlighted. */
  found: string | null;
  /** The version of a reply the reader chose, by its user message's key (absent: the newest). */
  versions: Record<string, number>;
}

const today = () => new Date().toLocaleDateString("en-CA");
const uuid = () => crypto.randomUUID();

export class Chat {
  state: ViewState = {
    token: null,
    signInError: null,
    threads: [],
    threadsCursor: null,
    threadsLoading: false,
    threadsError: null,
    titles: {},
    threadId: null,
    history: [],
    oldestDay: null,
    dayCursor: null,
    hasMore: false,
    historyLoading: false,
    historyError: null,
    live: [],
    runStatus: null,
    drafts: [],
    composerErrors: [],
    announcement: "",
    search: NO_SEARCH,
    found: null,
    versions: {},
  };
  private listeners = new Set<() => void>();
  private api: Api | null = null;
  private agent: SwitchboardAgent | null = null;
  private liveState: Live | null = null;
  /** Bumped when the open thread changes: loops of the previous one stop. */
  private generation = 0;
  /** The open thread's stream: runs started in other tabs and on other devices. */
  private feed: ThreadFeed | null = null;
  private feedDown = false;
  /** Runs of the open thread this tab streams itself: the thread stream's copies are dropped. */
  private ownRuns = new Set<string>();
  /** Runs from elsewhere whose items are live (never saved: a reload gets them again). */
  private foreignRuns = new Set<string>();
  /** Those of them shown from their first event: history's copy of them is left out. */
  private replayedRuns = new Set<string>();
  /** The run id of each task seen on the thread stream (its events carry only the task id). */
  private tasks = new Map<string, string>();
  /** The run from elsewhere being shown as it streams. */
  private watched: RunState | null = null;
  /** The open thread's first page of history (a snapshot of the thread is compared with it). */
  private historyLoaded: Promise<void> = Promise.resolve();
  /** The pending search of the box's text, while typing goes on. */
  private searchTimer: ReturnType<typeof setTimeout> | undefined;
  /** Bumped per search: the answer of an older one is dropped. */
  private searchSeq = 0;

  subscribe(listener: () => void): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  private set(patch: Partial<ViewState>): void {
    this.state = { ...this.state, ...patch };
    for (const listener of this.listeners) listener();
  }

  private announce(text: string): void {
    this.set({ announcement: text });
  }

  /**
   * The conversation as shown: history, then the live items. A message the live items show (by
   * id), or any message of a run they show from its first event, is left out of history, which
   * may hold part of it (history is written as a run streams).
   */
  get items(): ChatItem[] {
    const { history, live } = this.state;
    if (live.length === 0) return history;
    const keys = new Set(live.map((i) => i.key));
    const runs = new Set([...(this.liveState?.runIds ?? []), ...this.replayedRuns]);
    return [...history.filter((i) => !keys.has(i.key) && !(i.runId !== undefined && runs.has(i.runId))), ...live];
  }

  /** The conversation as shown: one version of each reply (versions.ts). */
  get rows(): Row[] {
    return versionRows(this.items, this.state.versions, this.replacing);
  }

  /** The runs whose items are live: a reply they ask for again has its version before they show any. */
  private get replacing(): Set<string> {
    return new Set([...(this.liveState?.runIds ?? []), ...this.foreignRuns]);
  }

  // ------------------------------------------------------------------ sign-in

  /** On load: a token from the sign-in link, or the one this tab already has. */
  async start(): Promise<void> {
    const token = tokenFromFragment() ?? session.token();
    if (token) await this.signIn(token);
  }

  async signIn(token: string): Promise<boolean> {
    const api = new Api(token.trim(), () => this.signOut("Your session has expired or the token was refused. Sign in again."));
    try {
      const page = await api.threads(null);
      session.setToken(api.token);
      this.api = api;
      this.set({ token: api.token, signInError: null, threads: page.threads, threadsCursor: page.nextCursor, titles: session.titles() });
      const thread = session.thread();
      if (thread) await this.openThread(thread);
      else this.newThread();
      return true;
    } catch (error) {
      const message =
        error instanceof ApiError && error.status === 401
          ? "This token was refused: check that it is complete and not expired."
          : `Cannot reach Switchboard: ${error instanceof Error ? error.message : String(error)}`;
      this.set({ signInError: message });
      return false;
    }
  }

  signOut(reason: string | null = null): void {
    this.generation += 1;
    this.agent?.abortRun();
    this.stopFeed();
    session.clear();
    this.api = null;
    this.agent = null;
    this.liveState = null;
    clearTimeout(this.searchTimer);
    this.searchSeq += 1;
    this.set({ token: null, signInError: reason, threads: [], threadId: null, history: [], live: [], drafts: [], runStatus: null, search: NO_SEARCH, found: null, versions: {} });
  }

  // ------------------------------------------------------------------ threads

  async loadThreads(more = false): Promise<void> {
    if (!this.api) return;
    this.set({ threadsLoading: true, threadsError: null });
    try {
      const page = await this.api.threads(more ? this.state.threadsCursor : null);
      const threads = more ? [...this.state.threads, ...page.threads.filter((t) => !this.state.threads.some((s) => s.threadId === t.threadId))] : page.threads;
      this.set({ threads, threadsCursor: page.nextCursor, threadsLoading: false });
    } catch (error) {
      this.set({ threadsLoading: false, threadsError: `Could not load conversations: ${messageOf(error)}` });
    }
  }

  /** A new conversation: its thread stream opens once its first run has started (until then the thread is empty). */
  newThread(): void {
    this.leaveThread();
    const threadId = uuid();
    session.setThread(threadId);
    this.agent = new SwitchboardAgent(this.api!.token, threadId);
    this.set({ threadId, history: [], live: [], oldestDay: null, dayCursor: null, hasMore: false, historyError: null, historyLoading: false, composerErrors: [], found: null, versions: {} });
    this.announce("New conversation");
  }

  private leaveThread(): void {
    this.generation += 1;
    this.agent?.abortRun();
    this.agent = null;
    this.liveState = null;
    this.stopFeed();
    this.set({ runStatus: null });
  }

  private stopFeed(): void {
    this.feed?.stop();
    this.feed = null;
    this.feedDown = false;
    this.ownRuns = new Set();
    this.foreignRuns = new Set();
    this.replayedRuns = new Set();
    this.tasks = new Map();
    this.watched = null;
    this.historyLoaded = Promise.resolve();
  }

  async openThread(threadId: string): Promise<void> {
    if (!this.api) return;
    this.leaveThread();
    const generation = this.generation;
    session.setThread(threadId);
    this.agent = new SwitchboardAgent(this.api.token, threadId);
    const live = session.live<Live>(threadId);
    this.liveState = live;
    this.ownRuns = new Set(live?.runIds ?? []);
    this.set({ threadId, history: [], live: live?.items ?? [], oldestDay: null, dayCursor: null, hasMore: false, historyLoading: true, historyError: null, composerErrors: [], found: null, versions: {} });
    const api = this.api;
    this.historyLoaded = (async () => {
      try {
        const day = await api.historyDay(threadId);
        if (generation !== this.generation) return;
        this.set({ history: this.fromHistory(day), oldestDay: day.day, dayCursor: day.nextCursor ?? null, hasMore: day.hasMore, historyLoading: false });
        // A reply this tab was asking again before the reload: history may not mark the one it
        // replaces yet.
        if (live?.supersedes && live.runIds[0]) this.supersede(live.supersedes, live.runIds[0]);
      } catch (error) {
        if (generation !== this.generation) return;
        if (error instanceof ApiError && error.status === 404) {
          this.set({ historyLoading: false }); // a thread with nothing stored yet
        } else {
          this.set({ historyLoading: false, historyError: `Could not load this conversation: ${messageOf(error)}` });
        }
      }
    })();
    // Runs started elsewhere on this conversation, from now on (and the one under way).
    this.openFeed();
    await this.historyLoaded;
    if (generation !== this.generation) return;
    // A run this tab was following before the reload: join it after the last event applied.
    if (live?.run && !live.run.terminal) void this.follow(live.run, null);
    for (const item of live?.items ?? []) {
      if (item.prompt?.status === "pending" && isExpired(item.prompt.interrupt)) this.promptExpired(item.key);
    }
  }

  async loadEarlier(): Promise<void> {
    const { threadId, oldestDay, dayCursor } = this.state;
    if (!this.api || !threadId || !oldestDay) return;
    const generation = this.generation;
    this.set({ historyLoading: true, historyError: null });
    try {
      // The rest of a day shown in part first, then the day before it.
      const day = dayCursor ? await this.api.historyDay(threadId, null, dayCursor) : await this.api.historyDay(threadId, oldestDay);
      if (generation !== this.generation) return;
      this.set({ history: [...this.fromHistory(day), ...this.state.history], oldestDay: day.day, dayCursor: day.nextCursor ?? null, hasMore: day.hasMore, historyLoading: false });
      this.announce(!day.day ? "No earlier messages" : dayCursor ? `Loaded earlier messages of ${day.day}` : `Loaded ${day.day}`);
    } catch (error) {
      if (generation !== this.generation) return;
      this.set({ historyLoading: false, historyError: `Could not load earlier messages: ${messageOf(error)}` });
    }
  }

  // ------------------------------------------------------------------ managing conversations

  /** The search box changed: searches `text` once typing pauses; blank goes back to the list. */
  search(text: string): void {
    clearTimeout(this.searchTimer);
    this.searchSeq += 1;
    if (!text.trim()) {
      this.set({ search: NO_SEARCH });
      return;
    }
    this.set({ search: { ...this.state.search, query: text, loading: true } });
    this.searchTimer = setTimeout(() => void this.runSearch(false), SEARCH_DEBOUNCE_MS);
  }

  /** The next page of the current search. */
  moreResults(): void {
    if (this.state.search.cursor && !this.state.search.loading) void this.runSearch(true);
  }

  private async runSearch(more: boolean): Promise<void> {
    const api = this.api;
    const { query, cursor, hits } = this.state.search;
    if (!api || !query.trim()) return;
    const seq = ++this.searchSeq;
    this.set({ search: { ...this.state.search, loading: true, error: null } });
    try {
      const page = await api.searchThreads(query, more ? cursor : null);
      if (seq !== this.searchSeq) return;
      const found = more && hits ? [...hits, ...page.threads.filter((t) => !hits.some((h) => h.threadId === t.threadId))] : page.threads;
      this.set({ search: { query, hits: found, cursor: page.nextCursor, loading: false, error: null } });
      this.announce(found.length === 0 ? "No conversation matches" : `${found.length} ${found.length === 1 ? "conversation" : "conversations"} found`);
    } catch (error) {
      if (seq !== this.searchSeq) return;
      // A refused query (nothing to look for, too long) says why in the server's words.
      const message = error instanceof ApiError && error.status === 400 ? error.message : `Could not search: ${messageOf(error)}`;
      this.set({ search: { query, hits: null, cursor: null, loading: false, error: message } });
    }
  }

  /**
   * Opens the thread of a search hit and shows its message: earlier days are loaded until it is
   * there. The hit's day is a UTC day; the days shown are the browser's, which may start a day
   * earlier, so the loading stops below that.
   */
  async openHit(hit: ThreadSearchHit): Promise<void> {
    const opening = this.openThread(hit.threadId);
    // Opening bumped the generation (synchronously): another thread opened meanwhile stops the loop.
    const generation = this.generation;
    await opening;
    const floor = addDays(hit.day, -1);
    for (let page = 0; generation === this.generation; page++) {
      if (this.items.some((i) => i.key === hit.messageId)) {
        // A previous version of a reply: that version is shown.
        const version = versionOf(this.items, hit.messageId, this.replacing);
        const versions = version ? { ...this.state.versions, [version.turn]: version.index } : this.state.versions;
        this.set({ found: hit.messageId, versions });
        this.announce("Showing the message found");
        return;
      }
      const { hasMore, oldestDay, historyError } = this.state;
      if (page >= REVEAL_PAGES || !hasMore || historyError || !oldestDay || oldestDay < floor) break;
      await this.loadEarlier();
    }
  }

  /** Gives a listed thread a title; throws the server's refusal (`ApiError`, 400 naming `/title`, 404). */
  async renameThread(threadId: string, title: string): Promise<void> {
    if (!this.api) return;
    const thread = await this.api.renameThread(threadId, title);
    const { threads, search } = this.state;
    this.set({
      threads: threads.map((t) => (t.threadId === threadId ? { ...t, ...thread } : t)),
      search: search.hits ? { ...search, hits: search.hits.map((h) => (h.threadId === threadId ? { ...h, title: thread.title } : h)) } : search,
    });
    this.announce(`Renamed to ${thread.title ?? title.trim()}`);
  }

  /**
   * Erases a thread everywhere; it leaves the list and the search results, and if it is the
   * open one, a new conversation takes its place. A 404 means it is gone already (deleted from
   * another tab): the same outcome. Throws other failures (a 503 may be retried).
   */
  async deleteThread(threadId: string): Promise<void> {
    if (!this.api) return;
    try {
      await this.api.deleteThread(threadId);
    } catch (error) {
      if (!(error instanceof ApiError && error.status === 404)) throw error;
    }
    session.forget(threadId);
    const { threads, search } = this.state;
    this.set({
      threads: threads.filter((t) => t.threadId !== threadId),
      search: search.hits ? { ...search, hits: search.hits.filter((h) => h.threadId !== threadId) } : search,
      titles: session.titles(),
    });
    if (this.state.threadId === threadId) this.newThread();
    this.announce("Conversation deleted");
  }

  /**
   * Branches a new conversation from the open one's message `messageId`: the server copies the
   * messages up to and with it into a new thread, which is listed and opened. Throws the
   * server's refusal (`ApiError`: 404 the thread is gone, 422 naming `/messageId` it holds no
   * such message, 503 may be retried).
   */
  async forkThread(messageId: string): Promise<void> {
    const from = this.state.threadId;
    if (!this.api || !from) return;
    const thread = await this.api.forkThread(from, messageId);
    const title = thread.title ?? this.state.threads.find((t) => t.threadId === from)?.title ?? this.state.titles[from] ?? null;
    if (title) session.setTitle(thread.threadId, title);
    this.set({ threads: [thread, ...this.state.threads.filter((t) => t.threadId !== thread.threadId)], titles: session.titles() });
    await this.openThread(thread.threadId);
    this.announce(`Branched into a new conversation${title ? `: ${title}` : ""}`);
  }

  /** A day of `/history/blocks` as chat items; runs this tab still follows are left out. */
  private fromHistory(day: HistoryDay): ChatItem[] {
    const skip = new Set(this.liveState?.runIds ?? []);
    const items: ChatItem[] = [];
    const steps = new Map<string, Step>();
    for (const message of day.messages) {
      const runId = message.metadata?.run_id;
      if (runId && skip.has(runId)) continue;
      const marks: Partial<ChatItem> = {};
      if (typeof message.metadata?.superseded_by === "string") marks.superseded = message.metadata.superseded_by;
      const from = message.metadata?.forked_from?.threadId;
      if (typeof from === "string") marks.forkedFrom = from;
      const text = message.content
        .filter((b): b is { type: "text"; text: string } => b.type === "text")
        .map((b) => b.text)
        .join("\n");
      if (message.role === "user") {
        items.push({ key: message.id, role: "user", text, files: userFiles(message), runId, day: day.day, ...marks });
      } else if (message.role === "tool" && message.toolCallId && steps.has(message.toolCallId)) {
        const step = steps.get(message.toolCallId)!;
        step.result = text;
        step.resultMessageId = message.id;
        step.status = "done";
        step.ui = message.uiSchema ?? null;
      } else {
        const item: ChatItem = { key: message.id, role: "assistant", text, runId, day: day.day, ...marks };
        if (message.role === "tool") item.text = `${message.metadata?.tool_name ?? "Tool"} returned: ${text}`;
        if (message.uiSchema) item.ui = [message.uiSchema];
        if (message.toolCalls?.length) {
          item.steps = message.toolCalls.map((call) => ({ id: call.id, kind: "tool", name: call.function.name, args: call.function.arguments, status: "called" }));
          for (const step of item.steps) steps.set(step.id, step);
        }
        const made = message.metadata?.attachments;
        if (Array.isArray(made) && made.length) item.files = made.map(generatedFile);
        items.push(item);
      }
    }
    return items;
  }

  // ------------------------------------------------------------------ files

  addFiles(files: File[]): void {
    if (!this.api) return;
    const { accepted, errors } = checkSelection(this.state.drafts.length, files);
    const drafts = accepted.map(({ file, type }) => ({ id: uuid(), file, type, phase: { kind: "hashing" } as UploadPhase }));
    this.set({ drafts: [...this.state.drafts, ...drafts], composerErrors: errors });
    if (errors.length) this.announce(errors.join(" "));
    for (const draft of drafts) {
      uploadFile(this.api, draft.file, draft.type, (phase) => this.updateDraft(draft.id, phase)).catch((error) =>
        this.updateDraft(draft.id, { kind: "error", message: `Upload failed: ${uploadError(error)}` }),
      );
    }
  }

  private updateDraft(id: string, phase: UploadPhase): void {
    if (!this.state.drafts.some((d) => d.id === id)) return;
    this.set({ drafts: this.state.drafts.map((d) => (d.id === id ? { ...d, phase } : d)) });
    if (phase.kind === "done") this.announce(phase.duplicate ? "File already uploaded: no upload needed" : "File uploaded");
    if (phase.kind === "error") this.announce(phase.message);
  }

  removeDraft(id: string): void {
    this.set({ drafts: this.state.drafts.filter((d) => d.id !== id) });
  }

  /** A fresh signed link for a file (links expire, so one is asked for on every open). */
  async downloadLink(file: FileRef): Promise<string> {
    if (!this.api || !file.contentUrl) throw new Error("this file is no longer available");
    return (await this.api.downloadUrl(file.contentUrl)).url;
  }

  // ------------------------------------------------------------------ runs

  get pendingPrompt(): ChatItem | undefined {
    return this.state.live.find((item) => item.prompt && (item.prompt.status === "pending" || item.prompt.status === "sending"));
  }

  get canSend(): boolean {
    const { drafts, runStatus } = this.state;
    return !!this.agent && runStatus === null && !this.pendingPrompt && drafts.every((d) => d.phase.kind === "done");
  }

  /** Sends a user turn: its text and the uploaded files. */
  send(text: string): boolean {
    const agent = this.agent;
    const threadId = this.state.threadId;
    if (!agent || !threadId || !this.canSend) return false;
    const body = text.trim();
    const files: FileRef[] = this.state.drafts.map((d) => ({
      name: d.file.name,
      contentUrl: d.phase.kind === "done" ? d.phase.contentUrl : null,
      mimeType: d.type,
      size: d.file.size,
      icon: FILE_TYPES[d.type]?.icon,
    }));
    if (!body && files.length === 0) return false;
    const content = files.length
      ? [
          ...(body ? [{ type: "text" as const, text: body }] : []),
          ...files.map((f) => ({
            type: f.mimeType!.startsWith("image/") ? ("image" as const) : ("document" as const),
            source: { type: "url" as const, value: f.contentUrl!, mimeType: f.mimeType! },
          })),
        ]
      : body;
    const runId = uuid();
    const messageId = uuid();
    const run: RunState = { runId, cursor: 0, started: false, terminal: false };
    this.ownRuns.add(runId);
    this.settleLive();
    this.liveState = {
      threadId,
      runIds: [runId],
      run,
      items: [{ key: messageId, role: "user", text: body, files, runId, day: today() }],
    };
    session.setTitle(threadId, body || files[0].name);
    this.set({ drafts: [], composerErrors: [], titles: session.titles() });
    this.publishLive();
    agent.setMessages([{ id: messageId, role: "user", content } as RunAgentInput["messages"][number]]);
    void this.follow(run, { runId });
    return true;
  }

  /** Whether the last reply may be asked for again now. */
  get canRegenerate(): boolean {
    return !!this.agent && this.state.runStatus === null && !this.pendingPrompt;
  }

  /**
   * Asks for the last reply again: a new run on the last user message, the same message (its
   * id, text and files) and nothing after it, as a new turn is sent. The server keeps the old
   * reply as a previous version (`superseded_by` the new run) and does not store the user
   * message again; this tab marks the old reply so at once, and the new one streams in its place.
   */
  regenerate(): boolean {
    const agent = this.agent;
    const threadId = this.state.threadId;
    if (!agent || !threadId || !this.canRegenerate) return false;
    const turn = [...this.items].reverse().find((i) => i.role === "user" && !i.superseded);
    if (!turn) return false;
    const files = turn.files ?? [];
    const content = files.length
      ? [
          ...(turn.text ? [{ type: "text" as const, text: turn.text }] : []),
          ...files.map((f) => ({
            type: f.mimeType?.startsWith("image/") ? ("image" as const) : ("document" as const),
            source: { type: "url" as const, value: f.contentUrl!, mimeType: f.mimeType ?? "application/octet-stream" },
          })),
        ]
      : turn.text;
    const runId = uuid();
    const run: RunState = { runId, cursor: 0, started: false, terminal: false };
    this.ownRuns.add(runId);
    this.settleLive();
    this.supersede(turn.key, runId);
    this.liveState = { threadId, runIds: [runId], run, items: [], supersedes: turn.key };
    const { [turn.key]: _, ...versions } = this.state.versions;
    this.set({ composerErrors: [], versions });
    this.publishLive();
    this.announce("Asking for the reply again");
    agent.setMessages([{ id: turn.key, role: "user", content } as RunAgentInput["messages"][number]]);
    void this.follow(run, { runId });
    return true;
  }

  /** Shows version `index` (0: the oldest) of the reply to the user message `turn`. */
  showVersion(turn: string, index: number, count: number): void {
    this.set({ versions: { ...this.state.versions, [turn]: index } });
    this.announce(`Version ${index + 1} of ${count}`);
  }

  /**
   * Marks the items history shows after the user message `turn` (but those of `runId` and
   * those `kept`) as a previous version, replaced by run `runId`, as history does.
   */
  private supersede(turn: string, runId: string, kept: ReadonlySet<string> = new Set()): void {
    const history = this.state.history;
    const at = history.findIndex((i) => i.key === turn && i.role === "user");
    if (at < 0) return;
    let changed = false;
    const marked = history.map((item, n) => {
      if (n <= at || item.superseded || item.runId === runId || kept.has(item.key)) return item;
      changed = true;
      return { ...item, superseded: runId };
    });
    if (changed) this.set({ history: marked });
  }

  /** Stop: asks the server to cancel; the stream then ends with RUN_ERROR `cancelled`. */
  async stop(): Promise<void> {
    // This tab's run, or one started elsewhere that this tab shows.
    const run = this.ownRunActive ? this.liveState!.run : this.watched;
    if (!this.api || !run || run.terminal) return;
    this.set({ runStatus: "stopping" });
    try {
      await this.api.cancelRun(run.runId);
    } catch (error) {
      this.pushNotice(run, "error", `Could not stop the run: ${messageOf(error)}`);
      this.set({ runStatus: "streaming" });
    }
  }

  /** Answers the pending prompt `key` (AG-UI `resume`); `null` dismisses it. */
  answer(key: string, payload: unknown, label: string | null): void {
    const agent = this.agent;
    const live = this.liveState;
    const item = live?.items.find((i) => i.key === key);
    if (!agent || !live || !item?.prompt || item.prompt.status !== "pending" || this.state.runStatus) return;
    const interrupt = item.prompt.interrupt;
    this.updatePrompt(key, { status: "sending", answer: label ?? undefined, error: undefined });
    const runId = uuid();
    const run: RunState = { runId, cursor: 0, started: false, terminal: false };
    this.ownRuns.add(runId);
    live.runIds.push(runId);
    live.run = run;
    this.publishLive();
    agent.pendingInterrupts = [interrupt as Interrupt];
    agent.setMessages([]);
    const resume = buildResumeArray(agent.pendingInterrupts, {
      [interrupt.id]: payload === null ? { status: "cancelled" } : { status: "resolved", payload },
    });
    void this.follow(run, { runId, resume }, key);
  }

  /** The prompt's time is up: the server closes it and starts `<promptId>-timeout`. */
  promptExpired(key: string): void {
    const live = this.liveState;
    const item = live?.items.find((i) => i.key === key);
    if (!live || !item?.prompt || item.prompt.status !== "pending") return;
    const error = item.prompt.interrupt.metadata?.prompt?.error ?? "This prompt is no longer available.";
    this.updatePrompt(key, { status: "timed_out", error });
    if (this.agent) this.agent.pendingInterrupts = [];
    const runId = `${item.prompt.interrupt.id}-timeout`;
    this.announce(error);
    // Already shown from the thread stream: nothing more to follow.
    if (this.foreignRuns.has(runId)) return;
    this.ownRuns.add(runId);
    if (!live.runIds.includes(runId)) live.runIds.push(runId);
    const run: RunState = { runId, cursor: 0, started: false, terminal: false, awaited: true };
    live.run = run;
    this.publishLive();
    void this.follow(run, null);
  }

  /**
   * Follows `run` to its terminal event: first by starting it (`start` given) or by joining it
   * after its last applied event, then, whenever the stream breaks before the end, by joining
   * it again from where it broke, until it ends or the thread is left.
   */
  private async follow(run: RunState, start: RunAgentParameters | null, promptKey?: string): Promise<void> {
    const agent = this.agent!;
    const generation = this.generation;
    let starting = start !== null;
    let attempt = 0;
    let waitedFor = 0;
    const subscriber: AgentSubscriber = {
      onEvent: ({ event }) => {
        const number = agent.nextEventNumber();
        if (number === null || generation !== this.generation) return;
        const first = !run.started;
        run.cursor = number;
        run.started = true;
        const asked = promptKey ? this.liveState?.items.find((i) => i.key === promptKey)?.prompt : undefined;
        if (asked?.status === "sending") this.updatePrompt(promptKey!, { status: asked.answer === undefined ? "dismissed" : "answered" });
        if (isProtocolEvent(event)) this.apply(run, event);
        if (this.state.runStatus !== "stopping" && !run.terminal) this.set({ runStatus: "streaming" });
        this.publishLive();
        // The thread has a run now: its stream can open (a new thread's answers 404 until then).
        if (first) this.openFeed();
      },
    };
    this.set({ runStatus: starting ? "sending" : "streaming" });
    for (;;) {
      let failure: unknown = null;
      try {
        if (starting) await agent.start(start!, subscriber);
        else await agent.follow(this.resumePoint(run), subscriber);
      } catch (error) {
        failure = error;
      }
      if (generation !== this.generation) return;
      if (run.terminal) break;
      if (agent.endedBeforeResume) {
        // The run ended while nobody listened: history has it all.
        run.terminal = true;
        void this.reloadHistory();
        break;
      }
      const status = (failure as { status?: number } | null)?.status;
      if (status === 404 && run.awaited && waitedFor < 60) {
        waitedFor += 1; // the server has not started the continuation yet
        await delay(500);
        if (generation !== this.generation) return;
        starting = false;
        continue;
      }
      if (status !== undefined && status >= 400 && status < 500 && status !== 408 && status !== 429) {
        this.refused(run, failure, promptKey, starting);
        break;
      }
      if (starting && status === undefined && failure && !run.started && !isNetworkError(failure)) {
        this.refused(run, failure, promptKey, starting);
        break;
      }
      // The stream broke (network, server restart) or ended early: join again where it broke.
      starting = false;
      attempt += 1;
      this.set({ runStatus: "reconnecting" });
      this.announce("Connection lost, reconnecting");
      await waitToRetry(attempt);
      if (generation !== this.generation) return;
    }
    this.set({ runStatus: this.watchedStatus() });
    this.publishLive();
    if (run.terminal && !this.pendingPrompt && this.liveState) {
      // Settled: history now holds every message of these runs.
      session.setLive(this.liveState.threadId, null);
    }
    void this.loadThreads();
  }

  private refused(run: RunState, failure: unknown, promptKey: string | undefined, starting: boolean): void {
    run.terminal = true;
    const message = failureMessage(failure);
    const prompt = promptKey ? this.liveState?.items.find((i) => i.key === promptKey)?.prompt : undefined;
    if (promptKey && prompt) {
      const status = (failure as { status?: number }).status;
      this.updatePrompt(promptKey, {
        status: status === 410 ? "timed_out" : "pending",
        error: status === 410 ? (prompt.interrupt.metadata?.prompt?.error ?? message) : `Your answer was not accepted: ${message}`,
      });
      if (status === 410 && this.liveState) this.liveState.runIds = this.liveState.runIds.filter((id) => id !== run.runId);
    } else {
      if (starting && !run.started && this.state.history.some((i) => i.superseded === run.runId)) {
        // A reply asked again that the server refused: the previous one is the reply still.
        this.set({ history: this.state.history.map((i) => (i.superseded === run.runId ? { ...i, superseded: undefined } : i)) });
      }
      this.pushNotice(run, "error", starting ? `Not sent: ${message}` : `The reply could not be followed: ${message}`);
    }
    this.announce(message);
  }

  /** Where to join `run`: after its last applied event, with the openers still open. */
  private resumePoint(run: RunState): ResumePoint {
    const open = run.started && run.cursor > 0 ? openers(this.liveState?.items ?? [], this.state.threadId!, run.runId) : [];
    return { runId: run.runId, after: run.cursor, openers: open };
  }

  private async reloadHistory(): Promise<void> {
    const threadId = this.state.threadId;
    if (!this.api || !threadId) return;
    if (this.liveState) {
      session.setLive(threadId, null);
      this.liveState = null;
      this.foreignRuns = new Set();
      this.replayedRuns = new Set();
      this.watched = null;
      this.set({ live: [], runStatus: null });
    }
    try {
      const day = await this.api.historyDay(threadId);
      this.set({ history: this.fromHistory(day), oldestDay: day.day, dayCursor: day.nextCursor ?? null, hasMore: day.hasMore });
    } catch (error) {
      this.set({ historyError: `Could not load this conversation: ${messageOf(error)}` });
    }
  }

  /** Moves the items of settled runs into the history list before a new turn. */
  private settleLive(): void {
    if (this.liveState) this.set({ history: this.items, live: [] });
    this.liveState = null;
    this.foreignRuns = new Set();
    this.replayedRuns = new Set();
  }

  /** Shows the live items and saves those of this tab's runs for a reload. */
  private publishLive(): void {
    const live = this.liveState;
    if (!live) return;
    live.items = [...live.items];
    const foreign = this.foreignRuns;
    session.setLive(live.threadId, foreign.size === 0 ? live : { ...live, items: live.items.filter((i) => !(i.runId !== undefined && foreign.has(i.runId))) });
    this.set({ live: live.items });
  }

  private updatePrompt(key: string, patch: Partial<PromptState>): void {
    const live = this.liveState;
    if (!live) return;
    live.items = live.items.map((i) => (i.key === key && i.prompt ? { ...i, prompt: { ...i.prompt, ...patch } } : i));
    this.publishLive();
  }

  private pushNotice(run: RunState, level: "info" | "error", text: string): void {
    this.liveState?.items.push({ key: `notice:${run.runId}:${this.liveState.items.length}`, role: "notice", level, text, runId: run.runId, day: today() });
    this.publishLive();
  }

  // ------------------------------------------------------------------ the thread stream

  /** Opens the open thread's stream, or asks it to try now if it waits (the thread was empty). */
  private openFeed(): void {
    const threadId = this.state.threadId;
    if (!this.api || !threadId) return;
    if (this.feed?.threadId === threadId) {
      this.feed.kick();
      return;
    }
    this.feed?.stop();
    const generation = this.generation;
    const feed = new ThreadFeed(this.api.token, threadId, {
      onFrame: (frame) => {
        if (generation === this.generation) this.onThreadFrame(frame);
      },
      onState: (state) => {
        if (generation === this.generation) this.onFeedState(state);
      },
      onUnauthorized: () => this.signOut("Your session has expired or the token was refused. Sign in again."),
    });
    this.feed = feed;
    feed.start();
  }

  private get ownRunActive(): boolean {
    const run = this.liveState?.run;
    return !!run && !run.terminal;
  }

  /** The status while no run of this tab's own streams: that of a run from elsewhere, if one does. */
  private watchedStatus(): RunStatus {
    if (!this.watched) return null;
    return this.feedDown ? "reconnecting" : "streaming";
  }

  private onFeedState(state: FeedState): void {
    this.feedDown = state === "down";
    if (!this.watched || this.ownRunActive || this.state.runStatus === "stopping") return;
    this.set({ runStatus: this.watchedStatus() });
    if (state === "down") this.announce("Connection lost, reconnecting");
  }

  /** One event of the thread stream. */
  private onThreadFrame({ id, event }: ThreadFrame): void {
    if (event.type === EventType.MESSAGES_SNAPSHOT) {
      void this.catchUp(event.messages);
      return;
    }
    const task = taskOf(id);
    if (!task) return; // the snapshot's other events (STATE_SNAPSHOT): this client shows no agent state
    if (event.type === EventType.RUN_STARTED || event.type === EventType.RUN_FINISHED) this.tasks.set(task, event.runId);
    const runId = this.tasks.get(task);
    // This tab's own runs come on their own streams: their copies here are dropped.
    if (runId === undefined || this.ownRuns.has(runId)) return;
    let run = this.watched?.runId === runId ? this.watched : null;
    if (event.type === EventType.RUN_STARTED) {
      // The continuation the server starts when a question shown here times out: this tab
      // follows it as its own (it may start before this tab's clock says the time is up).
      const expired = this.liveState?.items.find((i) => i.prompt?.status === "pending" && `${i.prompt.interrupt.id}-timeout` === runId);
      if (expired) {
        this.promptExpired(expired.key);
        if (this.ownRuns.has(runId)) return;
      }
      run = this.watchRun(runId, event);
    } else if (!run && event.type === EventType.RUN_FINISHED) {
      // Joined while the thread's last run waits on a question: its last event, the question.
      run = this.watchRun(runId, null);
    }
    if (!run) return;
    this.apply(run, event);
    if (run.terminal) {
      if (this.watched === run) this.watched = null;
      if (!this.ownRunActive) this.set({ runStatus: null });
      void this.loadThreads();
    } else if (!this.ownRunActive && this.state.runStatus !== "stopping") {
      this.set({ runStatus: this.watchedStatus() });
    }
    this.publishLive();
  }

  /**
   * Shows a run started elsewhere: from its RUN_STARTED (`started`; the user's message is in
   * its input), or only its last event (`null`), the question of the thread's waiting prompt.
   */
  private watchRun(runId: string, started: RunStartedEvent | null): RunState {
    const threadId = this.state.threadId!;
    const run: RunState = { runId, cursor: 0, started: true, terminal: false };
    if (started) {
      // The thread went on elsewhere: a question still open here was answered there.
      if (this.liveState) {
        const live = this.liveState;
        live.items = live.items.map((i) => (i.prompt?.status === "pending" ? { ...i, prompt: { ...i.prompt, status: "elsewhere" } } : i));
        this.publishLive();
      }
      if (this.agent) this.agent.pendingInterrupts = [];
      // This tab's runs before it are settled: they go to history, so that a reload (which
      // gets this run from history) still shows them before it.
      if (!this.ownRunActive && !this.replayedRuns.has(runId)) this.settleLive();
    }
    const live = (this.liveState ??= { threadId, runIds: [], items: [], run: null });
    this.foreignRuns.add(runId);
    if (!started) return run;
    this.replayedRuns.add(runId);
    // From its first event (again, after a fresh snapshot): what was shown of it is replaced.
    live.items = live.items.filter((i) => i.runId !== runId);
    // A reply asked again elsewhere (its user message is shown, sent with an earlier run): what
    // followed that message and the run's input leaves out is a previous version now.
    const input = started.input?.messages ?? [];
    const turn = [...input].reverse().find((m) => m.role === "user");
    if (turn && !started.input?.resume?.length && this.state.history.some((i) => i.key === turn.id && i.role === "user" && i.runId !== runId)) {
      this.supersede(turn.id, runId, new Set(input.map((m) => m.id)));
    }
    for (const message of input) {
      // A resent conversation's messages are shown already; the turn's own is new.
      if (message.role !== "user" || this.showsElsewhere(message.id, runId)) continue;
      const { text, files } = userTurn(message.content);
      live.items.push({ key: message.id, role: "user", text, files, runId, day: today() });
      if (this.state.history.length === 0 && live.items.length === 1) {
        // The conversation's first message: its title, as in the tab that sent it.
        session.setTitle(threadId, text || files[0]?.name || "Conversation");
        this.set({ titles: session.titles() });
      }
    }
    this.watched = run;
    return run;
  }

  /** Whether message `id` is shown, other than as part of run `runId`. */
  private showsElsewhere(id: string, runId: string): boolean {
    return this.liveState?.items.some((i) => i.key === id) === true || this.state.history.some((i) => i.key === id && i.runId !== runId);
  }

  /**
   * The thread's snapshot (on opening, and after a reconnect the server could not resume): if
   * its last message is not shown as it is there (a run ended between the history page and the
   * stream), history's latest page is read again and merged in.
   */
  private async catchUp(messages: Message[]): Promise<void> {
    const generation = this.generation;
    await this.historyLoaded;
    const threadId = this.state.threadId;
    const last = messages.at(-1);
    if (generation !== this.generation || !this.api || !threadId || !last || this.shows(last)) return;
    try {
      const day = await this.api.historyDay(threadId);
      if (generation !== this.generation) return;
      const fresh = this.fromHistory(day);
      const byKey = new Map(fresh.map((i) => [i.key, i]));
      const history = this.state.history.map((i) => byKey.get(i.key) ?? i);
      const had = new Set(history.map((i) => i.key));
      history.push(...fresh.filter((i) => !had.has(i.key)));
      const first = this.state.history.length === 0;
      this.set(first ? { history, oldestDay: day.day, dayCursor: day.nextCursor ?? null, hasMore: day.hasMore } : { history });
    } catch {
      // The next snapshot, or a reload, tries again.
    }
  }

  /** Whether `message` of a snapshot is shown, with the same text for the agent's. */
  private shows(message: Message): boolean {
    for (const item of this.items) {
      if (item.key === message.id) return message.role !== "assistant" || (message.content ?? "") === item.text || !!item.steps?.length;
      if (item.steps?.some((s) => s.resultMessageId === message.id)) return true;
    }
    return false;
  }

  // ------------------------------------------------------------------ AG-UI events

  /** Applies one AG-UI event of `run` to the live items (events.ts). */
  private apply(run: RunState, event: AGUIEvent): void {
    const live = this.liveState;
    if (!live) return;
    const applied = applyEvent(live.items, event, { runId: run.runId, day: today() });
    live.items = applied.items;
    if (applied.terminal) run.terminal = true;
    if (applied.announcement !== null) this.announce(applied.announcement);
  }
}

/** A user message of a run's input: its text and the files it points at. */
function userTurn(content: string | ContentPart[]): { text: string; files: FileRef[] } {
  if (typeof content === "string") return { text: content, files: [] };
  const text: string[] = [];
  const files: FileRef[] = [];
  for (const part of content) {
    if (part.type === "text") text.push(part.text);
    else if (part.source.type === "url") {
      const mimeType = part.source.mimeType;
      const filename: unknown = part.metadata?.filename;
      files.push({
        name: typeof filename === "string" ? filename : (part.source.value.split("/").pop() ?? part.source.value),
        contentUrl: part.source.value,
        mimeType,
        icon: mimeType ? FILE_TYPES[mimeType]?.icon : undefined,
      });
    }
  }
  return { text: text.join("\n"), files };
}

function userFiles(message: HistoryMessage): FileRef[] {
  const metadata = message.metadata ?? {};
  const stored: AttachedFile[] = Array.isArray(metadata.user_message_attachment_list)
    ? metadata.user_message_attachment_list
    : metadata.user_message_attachments
      ? [metadata.user_message_attachments]
      : [];
  return stored.map((file) => ({
    name: file.file_name ?? file.path.split("/").pop() ?? file.path,
    contentUrl: `s3://${file.bucket}/${file.path}`,
    mimeType: file.mime_type,
    size: file.size_bytes,
    icon: FILE_TYPES[file.mime_type]?.icon,
  }));
}

function isExpired(interrupt: PromptInterrupt): boolean {
  return interrupt.expiresAt !== undefined && new Date(interrupt.expiresAt).getTime() <= Date.now();
}

/** `day` (`YYYY-MM-DD`) moved by `n` days. */
function addDays(day: string, n: number): string {
  const [y, m, d] = day.split("-").map(Number);
  return new Date(Date.UTC(y, m - 1, d + n)).toISOString().slice(0, 10);
}

function messageOf(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}

/** The server's envelope message of a refused run, or the error's own. */
function failureMessage(error: unknown): string {
  const payload = (error as { payload?: unknown } | null)?.payload as { error?: { message?: string } } | undefined;
  return payload?.error?.message ?? messageOf(error);
}

function isNetworkError(error: unknown): boolean {
  return error instanceof TypeError || (error instanceof Error && /network|fetch|aborted|terminated/i.test(error.message));
}

function delay(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

/** Backoff between reconnects (0.5 s doubling to 8 s), cut short when the browser is back online. */
function waitToRetry(attempt: number): Promise<void> {
  const ms = Math.min(500 * 2 ** (attempt - 1), 8000);
  return new Promise((resolve) => {
    const done = () => {
      clearTimeout(timer);
      window.removeEventListener("online", done);
      resolve();
    };
    // Offline: nothing to try until the browser is back online.
    const timer = navigator.onLine ? setTimeout(done, ms) : undefined;
    window.addEventListener("online", done);
  });
}
