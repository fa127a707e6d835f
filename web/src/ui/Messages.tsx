// The conversation: day separators, user bubbles with their file chips, assistant messages
// with their tool calls as steps, cards and files blocks, notices and prompts.

import type { ChatItem, FileRef, Step } from "../chat";
import { FileChip } from "./FileChip";
import { PromptCard } from "./PromptCard";
import { UiCard } from "./UiCard";

interface Props {
  items: ChatItem[];
  /** The key of the message a search hit led to. */
  found?: string | null;
  openFile: (file: FileRef) => Promise<string>;
  busy: boolean;
  onAnswer: (key: string, payload: unknown, label: string | null) => void;
  onExpire: (key: string) => void;
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

function Item({ item, found, openFile, busy, onAnswer, onExpire }: { item: ChatItem } & Omit<Props, "items">) {
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
    <li class={`msg msg-${item.role}${item.key === found ? " msg-found" : ""}`} data-key={item.key} data-run={item.runId} aria-busy={item.streaming ? "true" : undefined}>
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
    </li>
  );
}

export function Messages({ items, ...rest }: Props) {
  const rows = [];
  let day: string | null | undefined;
  for (const item of items) {
    if (item.day && item.day !== day) {
      day = item.day;
      rows.push(
        <li class="day" key={`day-${day}`} role="presentation">
          <h2 class="day-label">{dayLabel(day)}</h2>
        </li>,
      );
    }
    rows.push(<Item key={item.key} item={item} {...rest} />);
  }
  return <ol class="messages">{rows}</ol>;
}
