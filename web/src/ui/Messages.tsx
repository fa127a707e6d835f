// The conversation: day separators, user bubbles with their file chips, assistant messages
// with their tool calls as steps, cards and files blocks, notices and prompts. Under a message,
// its actions: branch a new conversation from it; on the last reply, ask for it again; on a reply
// asked again, its versions ("‹ 2 / 2 ›", versions.ts).

import { useId, useState } from "preact/hooks";

import type { ChatItem, FileRef, Step } from "../chat";
import type { Row, VersionInfo } from "../versions";
import { FileChip } from "./FileChip";
import { PromptCard } from "./PromptCard";
import { UiCard } from "./UiCard";

interface Props {
  rows: Row[];
  /** The key of the message a search hit led to. */
  found?: string | null;
  openFile: (file: FileRef) => Promise<string>;
  busy: boolean;
  /** Whether the last reply may be asked for again now (no run, no open question). */
  canRegenerate: boolean;
  onAnswer: (key: string, payload: unknown, label: string | null) => void;
  onExpire: (key: string) => void;
  /** Resolves once the new conversation is open; rejects with the server's refusal. */
  onFork: (messageId: string) => Promise<void>;
  onRegenerate: () => void;
  onVersion: (turn: string, index: number, count: number) => void;
}

type ItemProps = Omit<Props, "rows"> & { row: Extract<Row, { kind: "item" }> };

function messageOf(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}

function BranchIcon() {
  return (
    <svg aria-hidden="true" width="16" height="16" viewBox="0 0 24 24" fill="none" stroke="currentColor" stroke-width="2" stroke-linecap="round" stroke-linejoin="round">
      <circle cx="6" cy="5" r="2" />
      <circle cx="6" cy="19" r="2" />
      <circle cx="18" cy="7" r="2" />
      <path d="M6 7v10" />
      <path d="M18 9c0 5-12 3-12 8" />
    </svg>
  );
}

function AgainIcon() {
  return (
    <svg aria-hidden="true" width="16" height="16" viewBox="0 0 24 24" fill="none" stroke="currentColor" stroke-width="2" stroke-linecap="round" stroke-linejoin="round">
      <path d="M20 11a8 8 0 1 0-2.3 5.7" />
      <path d="M20 4v7h-7" />
    </svg>
  );
}

/** The versions of a reply: the one shown, of how many, and the way to the others. */
function VersionSwitch({ versions, onVersion }: { versions: VersionInfo; onVersion: Props["onVersion"] }) {
  const { turn, index, count } = versions;
  return (
    <div class="versions" role="group" aria-label="Versions of this reply" data-turn={turn}>
      <button type="button" class="quiet msg-action version-prev" aria-label="Previous version" title="Previous version" disabled={index === 0} onClick={() => onVersion(turn, index - 1, count)}>
        ‹
      </button>
      <span class="version-count" aria-label={`Version ${index + 1} of ${count}`}>
        {index + 1} / {count}
      </span>
      <button type="button" class="quiet msg-action version-next" aria-label="Next version" title="Next version" disabled={index === count - 1} onClick={() => onVersion(turn, index + 1, count)}>
        ›
      </button>
    </div>
  );
}

/** Under a message: its versions, asking again (the last reply), branching from it; a refused branch says why. */
function Actions({ row, busy, canRegenerate, onFork, onRegenerate, onVersion }: ItemProps) {
  const { item, versions, regenerate } = row;
  const [forking, setForking] = useState(false);
  const [error, setError] = useState<string | null>(null);
  const errorId = useId();
  // A message of its own (not the steps of a run that wrote none), complete.
  const forkable = !item.streaming && !item.key.endsWith(":steps");
  if (!forkable && !versions) return null;
  const fork = async () => {
    if (forking) return;
    setForking(true);
    setError(null);
    try {
      await onFork(item.key); // the new conversation takes this one's place
    } catch (err) {
      // The server's words: "thread not found", "the thread holds no message with this id", ...
      setError(messageOf(err));
    } finally {
      setForking(false);
    }
  };
  return (
    <>
      <div class={`msg-actions${!versions && !regenerate ? " side" : ""}`}>
        {versions && <VersionSwitch versions={versions} onVersion={onVersion} />}
        {regenerate && !item.streaming && (
          <button type="button" class="quiet msg-action regenerate" aria-label="Regenerate this reply" title="Ask for this reply again" disabled={busy || !canRegenerate} onClick={onRegenerate}>
            <AgainIcon />
            <span class="action-label">Regenerate</span>
          </button>
        )}
        {forkable && (
          <button
            type="button"
            class="quiet msg-action fork"
            aria-label="Branch from here"
            title="Branch a new conversation from this message"
            aria-disabled={forking ? "true" : undefined}
            aria-describedby={error ? errorId : undefined}
            onClick={() => void fork()}
          >
            <BranchIcon />
            <span class="action-label">{forking ? "Branching…" : "Branch"}</span>
          </button>
        )}
      </div>
      {error && (
        <p id={errorId} class="field-error fork-error" role="alert">
          Could not branch from here: {error}
        </p>
      )}
    </>
  );
}

function dayLabel(day: string): string {
  const date = new Date(`${day}T12:00:00`);
  if (Number.isNaN(date.getTime())) return day;
  return date.toLocaleDateString(undefined, { weekday: "long", year: "numeric", month: "long", day: "numeric" });
}

function prettyArgs(args: string): string {
  try {
    return JSON.stringify(JSON.parse(args), null, 2);
  } catch {
    return args;
  }
}

function StepView({ step }: { step: Step }) {
  const label = step.status === "running" ? "running" : step.status === "called" ? "called" : "done";
  return (
    <li class={`step step-${step.status}`} data-step={step.name}>
      <details>
        <summary>
          <span class="step-icon" aria-hidden="true" />
          <span class="step-name">{step.kind === "tool" ? `Tool: ${step.name}` : step.name}</span>
          <span class="step-status">{label}</span>
        </summary>
        {step.args && (
          <div class="step-section">
            <span class="step-caption">Arguments</span>
            <pre>{prettyArgs(step.args)}</pre>
          </div>
        )}
        {step.result !== undefined && (
          <div class="step-section">
            <span class="step-caption">Result</span>
            <pre>{prettyArgs(step.result)}</pre>
          </div>
        )}
      </details>
      {step.ui && <UiCard schema={step.ui} />}
    </li>
  );
}

function Item(props: ItemProps) {
  const { row, found, openFile, busy, onAnswer, onExpire } = props;
  const item: ChatItem = row.item;
  if (item.role === "prompt") {
    return (
      <li class="msg msg-prompt" data-key={item.key}>
        <PromptCard item={item} disabled={busy} onAnswer={onAnswer} onExpire={onExpire} />
      </li>
    );
  }
  if (item.role === "notice") {
    return (
      <li class={`msg msg-notice notice-${item.level ?? "info"}`} data-key={item.key}>
        <p>{item.text}</p>
      </li>
    );
  }
  const who = item.role === "user" ? "You" : "Agent";
  return (
    <li
      class={`msg msg-${item.role}${item.key === found ? " msg-found" : ""}${item.superseded ? " msg-previous" : ""}`}
      data-key={item.key}
      data-run={item.runId}
      data-superseded={item.superseded}
      aria-busy={item.streaming ? "true" : undefined}
    >
      <span class="visually-hidden">{who}:</span>
      {item.steps && item.steps.length > 0 && (
        <ol class="steps" aria-label="Steps">
          {item.steps.map((step) => (
            <StepView key={step.id} step={step} />
          ))}
        </ol>
      )}
      {(item.text || item.streaming) && (
        <div class="msg-text">
          {item.text}
          {item.streaming && <span class="cursor" aria-hidden="true" />}
        </div>
      )}
      {item.ui?.map((schema, i) => <UiCard key={i} schema={schema} />)}
      {item.files && item.files.length > 0 && (
        <div class={item.role === "user" ? "chips" : "files-block"} aria-label={item.role === "user" ? "Attached files" : "Files"} role="group">
          {item.role !== "user" && <p class="files-title">Files</p>}
          {item.files.map((file, i) => (
            <FileChip key={`${file.contentUrl ?? file.name}-${i}`} file={file} open={openFile} />
          ))}
        </div>
      )}
      <Actions {...props} />
    </li>
  );
}

export function Messages({ rows, ...rest }: Props) {
  const shown = [];
  let day: string | null | undefined;
  for (const row of rows) {
    if (row.kind === "versions") {
      // A version with no reply to carry its switcher (a run that failed, or not begun yet).
      shown.push(
        <li class="msg-versions" key={`versions-${row.versions.turn}`}>
          <VersionSwitch versions={row.versions} onVersion={rest.onVersion} />
        </li>,
      );
      continue;
    }
    const item = row.item;
    if (item.day && item.day !== day) {
      day = item.day;
      shown.push(
        <li class="day" key={`day-${day}`} role="presentation">
          <h2 class="day-label">{dayLabel(day)}</h2>
        </li>,
      );
    }
    shown.push(<Item key={item.key} row={row} {...rest} />);
  }
  return <ol class="messages">{shown}</ol>;
}
