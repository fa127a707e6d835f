// The conversation's items and how one AG-UI event changes them: a pure reducer,
// `applyEvent(items, event, run) → { items, terminal, announcement }`. chat.ts keeps the items
// of the runs it shows live (its own runs, streamed from their requests, and runs from
// elsewhere, from the thread stream) and hands every event of a run to it; what the reducer
// returns replaces the live items, ends the run (`terminal`) and is told to screen readers
// (`announcement`).
//
// The events handled: TEXT_MESSAGE_START/CONTENT/END (an assistant message, by message id),
// TOOL_CALL_START/ARGS/END/RESULT and STEP_STARTED/FINISHED (the steps of an assistant
// message), Switchboard's CUSTOM events (`ui_hints`, `attachments`, `interaction_timeout`;
// types.ts `CustomValues`), RUN_FINISHED (its interrupts are prompts) and RUN_ERROR (a notice).
// The rest leave the items as they are: RUN_STARTED (chat.ts shows a run from elsewhere from
// its input), MESSAGES_SNAPSHOT (chat.ts compares the thread's snapshot with history),
// STATE_SNAPSHOT/DELTA (this client shows no agent state), and the CHUNK events, which AG-UI's
// client turns into START/CONTENT/END before a subscriber sees them.
//
// Items are never changed in place: an item that changes is a new object, and the array
// handed in is left as it was.

import { EventType } from "@ag-ui/client";
import type { AGUIEvent, BaseEvent, Interrupt } from "@ag-ui/client";

import type { CustomValues, GeneratedFile, Prompt, PromptInterrupt, UiSchemaRenderer } from "./types";
import { compileHints } from "./uischema";

/** A file shown as a chip: a user's attachment or a file the agent made. */
export interface FileRef {
  name: string;
  contentUrl: string | null;
  mimeType?: string;
  size?: number;
  icon?: string;
}

/** A tool call or an agent step, shown as a step of the assistant's message. */
export interface Step {
  id: string;
  kind: "tool" | "step";
  name: string;
  args: string;
  status: "running" | "called" | "done";
  result?: string;
  resultMessageId?: string;
  ui?: UiSchemaRenderer | null;
}

export interface PromptState {
  interrupt: PromptInterrupt;
  /** `elsewhere`: another tab or device went on with the thread (answered it). */
  status: "pending" | "sending" | "answered" | "dismissed" | "timed_out" | "elsewhere";
  answer?: string;
  error?: string;
}

export interface ChatItem {
  key: string;
  role: "user" | "assistant" | "notice" | "prompt";
  text: string;
  streaming?: boolean;
  files?: FileRef[];
  steps?: Step[];
  ui?: UiSchemaRenderer[];
  runId?: string;
  day?: string | null;
  level?: "info" | "error";
  prompt?: PromptState;
  /** A previous version of a reply: the id of the run that asked for it again. */
  superseded?: string;
  /** A message copied into this thread by a fork: the thread it comes from. */
  forkedFrom?: string;
}

/** The run an event belongs to, and the day the items it adds are shown under. */
export interface EventRun {
  runId: string;
  /** `YYYY-MM-DD`, the browser's today. */
  day: string;
}

/** The items after an event, and what else the event did. */
export interface Applied {
  items: ChatItem[];
  /** The event ended the run (RUN_FINISHED, RUN_ERROR). */
  terminal: boolean;
  /** What to tell a screen reader, if anything. */
  announcement: string | null;
}

const EVENT_TYPES: ReadonlySet<string> = new Set(Object.values(EventType));

/**
 * Whether an event a subscriber of AG-UI's client is handed (typed as the loose `BaseEvent`)
 * is one of the protocol's events. The client's pipeline (`enforceEvents`) has validated every
 * event against the protocol's schema by then, dropping those of unknown types, so the type tag
 * is all that is left to check.
 */
export function isProtocolEvent(event: BaseEvent): event is AGUIEvent {
  return EVENT_TYPES.has(event.type);
}

/** Applies one AG-UI event of `run` to `input`, the live items. */
export function applyEvent(input: readonly ChatItem[], event: AGUIEvent, run: EventRun): Applied {
  let items = [...input];
  let terminal = false;
  let announcement: string | null = null;
  const item = (key: string): ChatItem => {
    let found = items.find((i) => i.key === key);
    if (!found) {
      found = { key, role: "assistant", text: "", runId: run.runId, day: run.day };
      items.push(found);
    }
    return found;
  };
  const replace = (target: ChatItem, patch: Partial<ChatItem>) => {
    const index = items.indexOf(target);
    items[index] = { ...target, ...patch };
  };
  const stepOf = (id: string): [ChatItem, Step] | null => {
    for (const candidate of items) {
      const step = candidate.steps?.find((s) => s.id === id);
      if (step) return [candidate, step];
    }
    return null;
  };
  const updateStep = (id: string, patch: (step: Step) => Partial<Step>) => {
    const found = stepOf(id);
    if (!found) return;
    const [owner, step] = found;
    replace(owner, { steps: owner.steps!.map((s) => (s === step ? { ...s, ...patch(s) } : s)) });
  };
  const lastAssistant = (): ChatItem => {
    const mine = items.filter((i) => i.runId === run.runId && i.role === "assistant");
    return mine[mine.length - 1] ?? item(`${run.runId}:steps`);
  };
  const closeAll = () => {
    items = items.map((i) => (i.runId === run.runId && i.streaming ? { ...i, streaming: false } : i));
  };
  switch (event.type) {
    case EventType.TEXT_MESSAGE_START:
      replace(item(event.messageId), { streaming: true });
      break;
    case EventType.TEXT_MESSAGE_CONTENT: {
      const target = item(event.messageId);
      replace(target, { text: target.text + event.delta, streaming: true });
      break;
    }
    case EventType.TEXT_MESSAGE_END:
      replace(item(event.messageId), { streaming: false });
      break;
    case EventType.TOOL_CALL_START: {
      const owner = event.parentMessageId ? item(event.parentMessageId) : lastAssistant();
      replace(owner, { steps: [...(owner.steps ?? []), { id: event.toolCallId, kind: "tool", name: event.toolCallName, args: "", status: "running" }] });
      break;
    }
    case EventType.TOOL_CALL_ARGS: {
      const delta = event.delta;
      updateStep(event.toolCallId, (s) => ({ args: s.args + delta }));
      break;
    }
    case EventType.TOOL_CALL_END:
      updateStep(event.toolCallId, () => ({ status: "called" }));
      break;
    case EventType.TOOL_CALL_RESULT: {
      const { content, messageId } = event;
      updateStep(event.toolCallId, () => ({ status: "done", result: typeof content === "string" ? content : JSON.stringify(content), resultMessageId: messageId }));
      break;
    }
    case EventType.STEP_STARTED: {
      const owner = lastAssistant();
      const id = `step:${event.stepName}:${owner.steps?.length ?? 0}`;
      replace(owner, { steps: [...(owner.steps ?? []), { id, kind: "step", name: event.stepName, args: "", status: "running" }] });
      break;
    }
    case EventType.STEP_FINISHED:
      for (const owner of items) {
        const step = owner.steps?.find((s) => s.kind === "step" && s.name === event.stepName && s.status === "running");
        if (step) {
          updateStep(step.id, () => ({ status: "done" }));
          break;
        }
      }
      break;
    case EventType.CUSTOM: {
      const value: unknown = event.value;
      if (event.name === "ui_hints" && isCustom("ui_hints", value)) {
        const schema = compileHints(value.hints);
        if (!schema) break;
        const owner = items.find((i) => i.steps?.some((s) => s.resultMessageId === value.messageId));
        if (owner) {
          const step = owner.steps!.find((s) => s.resultMessageId === value.messageId)!;
          updateStep(step.id, () => ({ ui: schema }));
        } else {
          const target = item(value.messageId);
          replace(target, { ui: [...(target.ui ?? []), schema] });
        }
      } else if (event.name === "attachments" && isCustom("attachments", value)) {
        const target = item(value.messageId);
        replace(target, { files: [...(target.files ?? []), ...value.files.map(generatedFile)] });
      } else if (event.name === "interaction_timeout" && isCustom("interaction_timeout", value)) {
        const prompt = items.find((i) => i.prompt?.interrupt.id === value.promptId);
        if (prompt?.prompt) {
          replace(prompt, { prompt: { ...prompt.prompt, status: "timed_out", error: value.error ?? prompt.prompt.error } });
        } else {
          items.push({ key: `notice:${run.runId}:timeout`, role: "notice", level: "info", text: value.error ?? "A question timed out.", runId: run.runId, day: run.day });
        }
      }
      break;
    }
    case EventType.RUN_FINISHED: {
      terminal = true;
      closeAll();
      if (event.outcome?.type === "interrupt") {
        for (const interrupt of event.outcome.interrupts) {
          const key = `prompt:${interrupt.id}`;
          // Once: a tab that saw the question come may be sent it again (a fresh snapshot).
          if (items.some((i) => i.key === key)) continue;
          items.push({ key, role: "prompt", text: interrupt.message ?? "", runId: run.runId, day: run.day, prompt: { interrupt: promptInterrupt(interrupt), status: "pending" } });
        }
        announcement = "The agent asks you a question";
      } else {
        announcement = "Reply complete";
      }
      break;
    }
    case EventType.RUN_ERROR:
      terminal = true;
      closeAll();
      if (event.code === "cancelled") {
        items.push({ key: `notice:${run.runId}:stopped`, role: "notice", level: "info", text: "Stopped: the agent was cancelled before it finished.", runId: run.runId, day: run.day });
        announcement = "Stopped";
      } else {
        items.push({ key: `notice:${run.runId}:error`, role: "notice", level: "error", text: `The run failed: ${event.message || event.code || "unknown error"}`, runId: run.runId, day: run.day });
        announcement = "The run failed";
      }
      break;
    default:
      break;
  }
  return { items, terminal, announcement };
}

/**
 * The openers of run `runId` still open in `items`, for a stream that joins the run after its
 * last applied event: its RUN_STARTED, the TEXT_MESSAGE_START of each message still streaming
 * and the TOOL_CALL_START of each tool call still running (agent.ts puts them at the head of the
 * stream for AG-UI's event verifier; chat.ts does not apply them again).
 */
export function openers(items: readonly ChatItem[], threadId: string, runId: string): AGUIEvent[] {
  const events: AGUIEvent[] = [{ type: EventType.RUN_STARTED, threadId, runId }];
  for (const item of items) {
    if (item.runId !== runId) continue;
    if (item.streaming) events.push({ type: EventType.TEXT_MESSAGE_START, messageId: item.key, role: "assistant" });
    for (const step of item.steps ?? []) {
      if (step.kind === "tool" && step.status === "running") {
        events.push({ type: EventType.TOOL_CALL_START, toolCallId: step.id, toolCallName: step.name, parentMessageId: item.key });
      }
    }
  }
  return events;
}

/** Whether a CUSTOM event's value has the shape its name promises (types.ts, `CustomValues`). */
export function isCustom<N extends keyof CustomValues>(name: N, value: unknown): value is CustomValues[N] {
  if (typeof value !== "object" || value === null) return false;
  const fields = value as Record<string, unknown>;
  switch (name) {
    case "ui_hints":
      return typeof fields.messageId === "string" && typeof fields.hints === "object" && fields.hints !== null;
    case "attachments":
      return typeof fields.messageId === "string" && Array.isArray(fields.files);
    case "interaction_timeout":
      return typeof fields.promptId === "string";
    default:
      return false;
  }
}

/** An AG-UI interrupt as Switchboard sends it: its prompt in `metadata.prompt`. */
export function promptInterrupt(interrupt: Interrupt): PromptInterrupt {
  const prompt: unknown = interrupt.metadata?.prompt;
  return {
    id: interrupt.id,
    reason: interrupt.reason,
    message: interrupt.message,
    responseSchema: interrupt.responseSchema,
    expiresAt: interrupt.expiresAt,
    metadata: typeof prompt === "object" && prompt !== null ? { prompt: prompt as Prompt } : undefined,
  };
}

/** A file the agent made (`CUSTOM attachments`, history's `metadata.attachments`) as a chip. */
export function generatedFile(file: GeneratedFile): FileRef {
  return { name: file.filename, contentUrl: file.content_url ?? null, icon: file.icon_type };
}
