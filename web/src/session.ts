// What the tab remembers, in sessionStorage only (never localStorage or cookies): the bearer
// token, the open thread and the state of a run in flight, so a reload resumes where it was.

const TOKEN = "sb.token";
const THREAD = "sb.thread";
const LIVE = "sb.live.";
const TITLES = "sb.titles";

function read(key: string): string | null {
  try {
    return sessionStorage.getItem(key);
  } catch {
    return null;
  }
}

function write(key: string, value: string | null): void {
  try {
    if (value === null) sessionStorage.removeItem(key);
    else sessionStorage.setItem(key, value);
  } catch {
    // Storage full or disabled: the tab still works, it just cannot resume after a reload.
  }
}

/** Takes `#token=<jwt>` out of the address (the sign-in link of scripts/up.sh). */
export function tokenFromFragment(): string | null {
  const hash = location.hash.startsWith("#") ? location.hash.slice(1) : location.hash;
  const token = new URLSearchParams(hash).get("token");
  if (token === null) return null;
  history.replaceState(null, "", location.pathname + location.search);
  return token.trim() || null;
}

export const session = {
  token: (): string | null => read(TOKEN),
  setToken: (token: string | null) => write(TOKEN, token),
  thread: (): string | null => read(THREAD),
  setThread: (id: string | null) => write(THREAD, id),
  live<T>(threadId: string): T | null {
    const raw = read(LIVE + threadId);
    if (raw === null) return null;
    try {
      return JSON.parse(raw) as T;
    } catch {
      return null;
    }
  },
  setLive(threadId: string, value: unknown | null): void {
    write(LIVE + threadId, value === null ? null : JSON.stringify(value));
  },
  titles(): Record<string, string> {
    try {
      return JSON.parse(read(TITLES) ?? "{}") as Record<string, string>;
    } catch {
      return {};
    }
  },
  setTitle(threadId: string, title: string): void {
    const titles = session.titles();
    if (titles[threadId]) return;
    titles[threadId] = title;
    write(TITLES, JSON.stringify(titles));
  },
  /** Forgets what the tab kept of a thread that was deleted: its title and its run in flight. */
  forget(threadId: string): void {
    write(LIVE + threadId, null);
    const titles = session.titles();
    if (!(threadId in titles)) return;
    delete titles[threadId];
    write(TITLES, JSON.stringify(titles));
  },
  clear(): void {
    try {
      sessionStorage.clear();
    } catch {
      // nothing to clear
    }
  },
};
