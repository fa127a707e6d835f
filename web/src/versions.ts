// The versions of a reply. A reply asked again (regenerated) replaces the reply to its user
// message; the one replaced stays, as a previous version: history marks each of its messages
// `superseded_by` the new run's id (services/history, `regenerate`), and this tab marks them so
// itself the moment it asks again (chat.ts, `superseded`). The conversation shows one version of
// each turn's reply at a time, the newest unless the reader chose another, with a switcher
// ("‹ 2 / 2 ›") on it; nothing is shown twice.
//
// A turn is a user message and the items after it up to the next user message (one superseded
// with a reply belongs to the version it was part of). Its versions are the runs of consecutive
// items with the same `superseded` mark, oldest first; the newest has none. A reply being asked
// again has a version of its own before its first item comes (its run is under way).

import type { ChatItem } from "./chat";

/** Which version of a turn's reply is shown, of how many. */
export interface VersionInfo {
  /** The key of the user message the reply answers (`""`: the items before the first one). */
  turn: string;
  /** 0-based; `count - 1` is the newest. */
  index: number;
  count: number;
}

/** What the conversation shows, in order. */
export type Row =
  | {
      kind: "item";
      item: ChatItem;
      /** On the last assistant message of a reply that has versions: the switcher. */
      versions?: VersionInfo;
      /** The last reply of the conversation, newest version: it may be asked again. */
      regenerate?: boolean;
    }
  /** The switcher of a version with no assistant message (a run that failed, or not begun). */
  | { kind: "versions"; versions: VersionInfo };

interface Turn {
  user: ChatItem | null;
  versions: ChatItem[][];
}

/** The turns of `items`, each reply split into its versions. */
function turns(items: ChatItem[], replacing: ReadonlySet<string>): Turn[] {
  const out: Turn[] = [];
  let current: Turn = { user: null, versions: [] };
  let marked: string | null | undefined; // the mark of the version being filled
  for (const item of items) {
    if (item.role === "user" && !item.superseded) {
      if (current.user || current.versions.length) out.push(current);
      current = { user: item, versions: [] };
      marked = undefined;
      continue;
    }
    const mark = item.superseded ?? null;
    if (current.versions.length === 0 || mark !== marked) current.versions.push([]);
    current.versions.at(-1)!.push(item);
    marked = mark;
  }
  if (current.user || current.versions.length) out.push(current);
  for (const turn of out) {
    const last = turn.versions.at(-1)?.[0]?.superseded;
    // Replaced by a run under way that has nothing to show yet: its version is empty.
    if (last && replacing.has(last)) turn.versions.push([]);
  }
  return out;
}

/**
 * The rows the conversation shows. `chosen`: the version the reader picked per turn (absent:
 * the newest); `replacing`: the runs this tab shows or follows (a reply they replace has a
 * newer version even before their first event).
 */
export function versionRows(items: ChatItem[], chosen: Readonly<Record<string, number>>, replacing: ReadonlySet<string>): Row[] {
  const rows: Row[] = [];
  const all = turns(items, replacing);
  all.forEach((turn, n) => {
    if (turn.user) rows.push({ kind: "item", item: turn.user });
    const count = turn.versions.length;
    if (count === 0) return;
    const key = turn.user?.key ?? "";
    const index = count === 1 ? 0 : Math.min(Math.max(chosen[key] ?? count - 1, 0), count - 1);
    const shown = turn.versions[index];
    const newest = index === count - 1;
    const versions: VersionInfo | undefined = count > 1 ? { turn: key, index, count } : undefined;
    let lastAssistant = shown.length - 1;
    while (lastAssistant >= 0 && shown[lastAssistant].role !== "assistant") lastAssistant -= 1;
    const lastTurn = n === all.length - 1 && turn.user !== null;
    shown.forEach((item, at) => {
      const row: Row = { kind: "item", item };
      if (at === lastAssistant) {
        if (versions) row.versions = versions;
        if (lastTurn && newest) row.regenerate = true;
      }
      rows.push(row);
    });
    if (versions && lastAssistant < 0) rows.push({ kind: "versions", versions });
  });
  return rows;
}

/** The turn and version that show the item `key` (null: every version shows it, or none). */
export function versionOf(items: ChatItem[], key: string, replacing: ReadonlySet<string>): { turn: string; index: number } | null {
  for (const turn of turns(items, replacing)) {
    if (turn.versions.length < 2) continue;
    const index = turn.versions.findIndex((version) => version.some((i) => i.key === key));
    if (index >= 0) return { turn: turn.user?.key ?? "", index };
  }
  return null;
}
