import { useEffect, useLayoutEffect, useReducer, useRef, useState } from "preact/hooks";

import type { Chat } from "../chat";
import { Composer } from "./Composer";
import { Messages } from "./Messages";
import { SignIn } from "./SignIn";
import { Threads } from "./Threads";

const STATUS_TEXT = {
  sending: "Sending…",
  streaming: "The agent is replying…",
  reconnecting: "Connection lost. Reconnecting…",
  stopping: "Stopping…",
} as const;

export function App({ chat }: { chat: Chat }) {
  const [, render] = useReducer((n: number, _: unknown) => n + 1, 0);
  useEffect(() => chat.subscribe(() => render(undefined)), [chat]);
  const state = chat.state;
  const [drawer, setDrawer] = useState(false);
  const scroller = useRef<HTMLDivElement>(null);
  const stick = useRef(true);
  const firstKey = useRef<string | null>(null);
  const lastHeight = useRef(0);
  const revealed = useRef<string | null>(null);
  const items = chat.items;

  // Follow the conversation while the reader is at the bottom; keep the place when earlier
  // days are put above.
  useLayoutEffect(() => {
    const el = scroller.current;
    if (!el) return;
    const head = items[0]?.key ?? null;
    if (head !== firstKey.current && firstKey.current !== null && items.some((i) => i.key === firstKey.current)) {
      el.scrollTop += el.scrollHeight - lastHeight.current;
    } else if (stick.current) {
      el.scrollTop = el.scrollHeight;
    }
    firstKey.current = head;
    lastHeight.current = el.scrollHeight;
  });

  // The message a search hit led to: scrolled to once it is shown (and the view stops following
  // the bottom, so the reader stays there).
  useLayoutEffect(() => {
    const key = state.found;
    if (key === revealed.current) return;
    const target = key ? scroller.current?.querySelector<HTMLElement>(`[data-key="${CSS.escape(key)}"]`) : null;
    if (key && !target) return;
    revealed.current = key;
    if (!target) return;
    stick.current = false;
    target.scrollIntoView({ block: "center" });
  });

  useEffect(() => {
    if (!drawer) return;
    const onKey = (e: KeyboardEvent) => e.key === "Escape" && setDrawer(false);
    window.addEventListener("keydown", onKey);
    document.querySelector<HTMLElement>("#threads-nav .thread, #threads-nav button")?.focus();
    return () => window.removeEventListener("keydown", onKey);
  }, [drawer]);

  if (!state.token) return <SignIn error={state.signInError} onSignIn={(t) => chat.signIn(t)} />;

  const prompt = chat.pendingPrompt;
  const titleOf = (threadId: string) => state.threads.find((t) => t.threadId === threadId)?.title ?? state.titles[threadId];
  const title = state.threadId ? titleOf(state.threadId) : undefined;
  // A branch: its copied messages name the conversation they come from.
  const forkedFrom = items.find((i) => i.forkedFrom)?.forkedFrom;
  return (
    <div class={`app${drawer ? " drawer-open" : ""}`}>
      <a class="skip" href="#message-text">
        Skip to the message box
      </a>
      <header class="topbar">
        <button
          type="button"
          class="icon-button menu"
          aria-expanded={drawer}
          aria-controls="threads-nav"
          onClick={() => setDrawer(!drawer)}
        >
          <svg aria-hidden="true" width="22" height="22" viewBox="0 0 24 24" fill="none" stroke="currentColor" stroke-width="2" stroke-linecap="round">
            <path d="M4 6h16M4 12h16M4 18h16" />
          </svg>
          <span class="visually-hidden">Conversations</span>
        </button>
        <h1 class="brand">Switchboard</h1>
        <button
          type="button"
          class="primary new-thread"
          onClick={() => {
            chat.newThread();
            setDrawer(false);
            document.getElementById("message-text")?.focus();
          }}
        >
          <span class="plus" aria-hidden="true">
            +
          </span>
          <span class="new-label">New conversation</span>
        </button>
        <button type="button" class="quiet signout" onClick={() => chat.signOut()}>
          Sign out
        </button>
      </header>
      <nav id="threads-nav" class="sidebar" aria-label="Conversations">
        <h2 class="sidebar-title">Conversations</h2>
        <Threads
          threads={state.threads}
          current={state.threadId}
          titles={state.titles}
          hasMore={state.threadsCursor !== null}
          loading={state.threadsLoading}
          error={state.threadsError}
          search={state.search}
          onOpen={(id) => {
            setDrawer(false);
            stick.current = true;
            void chat.openThread(id);
          }}
          onMore={() => void chat.loadThreads(true)}
          onSearch={(text) => chat.search(text)}
          onMoreResults={() => chat.moreResults()}
          onOpenHit={(hit) => {
            setDrawer(false);
            stick.current = true;
            void chat.openHit(hit);
          }}
          onRename={(id, title) => chat.renameThread(id, title)}
          onDelete={(id) => chat.deleteThread(id)}
        />
      </nav>
      <div class="scrim" onClick={() => setDrawer(false)} aria-hidden="true" />
      <main id="main" class="conversation" aria-labelledby="conversation-title">
        <h2 id="conversation-title" class="visually-hidden">
          {title ?? "Conversation"}
        </h2>
        <div
          class="scroller"
          ref={scroller}
          onScroll={(e) => {
            const el = e.currentTarget as HTMLDivElement;
            stick.current = el.scrollHeight - el.scrollTop - el.clientHeight < 80;
          }}
        >
          {state.hasMore && (
            <button type="button" class="quiet earlier" onClick={() => void chat.loadEarlier()} disabled={state.historyLoading}>
              {state.historyLoading ? "Loading…" : "Load earlier messages"}
            </button>
          )}
          {state.historyError && (
            <p class="field-error" role="alert">
              {state.historyError}
            </p>
          )}
          {forkedFrom && (
            <p class="forked-note">
              Branched from{" "}
              <button
                type="button"
                class="link-button forked-from"
                data-thread={forkedFrom}
                onClick={() => {
                  stick.current = true;
                  void chat.openThread(forkedFrom);
                }}
              >
                {titleOf(forkedFrom) ?? "another conversation"}
              </button>
            </p>
          )}
          {items.length === 0 && !state.historyLoading && (
            <div class="empty">
              <p>Start the conversation below.</p>
              <p class="empty-hint">
                Try <code>/ui Weekly report</code>, <code>/tool lookup {"{\"q\": 1}"}</code>, <code>/ask radio Pick one</code> or
                attach a file.
              </p>
            </div>
          )}
          <Messages
            rows={chat.rows}
            found={state.found}
            openFile={(file) => chat.downloadLink(file)}
            busy={state.runStatus !== null}
            canRegenerate={chat.canRegenerate}
            onAnswer={(key, payload, label) => chat.answer(key, payload, label)}
            onExpire={(key) => chat.promptExpired(key)}
            onFork={async (messageId) => {
              await chat.forkThread(messageId);
              stick.current = true;
              document.getElementById("message-text")?.focus();
            }}
            onRegenerate={() => {
              stick.current = true;
              chat.regenerate();
            }}
            onVersion={(turn, index, count) => chat.showVersion(turn, index, count)}
          />
        </div>
        <p class={`run-status${state.runStatus ? " active" : ""}`} data-status={state.runStatus ?? "idle"}>
          {state.runStatus ? STATUS_TEXT[state.runStatus] : ""}
        </p>
        <Composer
          drafts={state.drafts}
          errors={state.composerErrors}
          runStatus={state.runStatus}
          canSend={chat.canSend}
          promptPending={!!prompt}
          onFiles={(files) => chat.addFiles(files)}
          onRemove={(id) => chat.removeDraft(id)}
          onSend={(text) => {
            stick.current = true;
            return chat.send(text);
          }}
          onStop={() => void chat.stop()}
        />
      </main>
      <div class="visually-hidden" role="status" aria-live="polite">
        {state.announcement}
      </div>
    </div>
  );
}
