// The AG-UI event reducer (events.ts), one event type at a time and in the sequences a run
// streams: every input is frozen, so a reducer that changed the items handed in would throw.

import { compactEvents, EventType, transformChunks, verifyEvents } from "@ag-ui/client";
import type { AGUIEvent, BaseEvent } from "@ag-ui/client";
import { from, lastValueFrom, toArray } from "rxjs";
import { describe, expect, it } from "vitest";

import { applyEvent, generatedFile, isCustom, isProtocolEvent, openers, promptInterrupt, type Applied, type ChatItem, type EventRun } from "./events";
import type { UiSchemaRenderer } from "./types";

const DAY = "2025-03-04";
const RUN: EventRun = { runId: "run-1", day: DAY };
const THREAD = "thread-1";

function frozen<T>(value: T): T {
  if (typeof value === "object" && value !== null && !Object.isFrozen(value)) {
    for (const field of Object.values(value)) frozen(field);
    Object.freeze(value);
  }
  return value;
}

/** One event applied to (a frozen copy of) `items`. */
function apply(items: ChatItem[], event: AGUIEvent, run: EventRun = RUN): Applied {
  return applyEvent(frozen(structuredClone(items)), frozen(event), run);
}

/** Events applied in order, as chat.ts applies a run's stream: the run ends at its terminal event. */
function fold(events: AGUIEvent[], items: ChatItem[] = [], run: EventRun = RUN): Applied & { announcements: string[] } {
  let state: Applied = { items, terminal: false, announcement: null };
  const announcements: string[] = [];
  for (const event of events) {
    const next = apply(state.items, event, run);
    if (next.announcement !== null) announcements.push(next.announcement);
    state = { ...next, terminal: state.terminal || next.terminal };
  }
  return { ...state, announcements };
}

/** AG-UI's own check of a stream's order (the client runs it on every stream). */
async function verified(events: BaseEvent[]): Promise<BaseEvent[]> {
  return lastValueFrom(from(events).pipe(verifyEvents(), toArray()));
}

const assistant = (key: string, text: string, extra: Partial<ChatItem> = {}): ChatItem => ({ key, role: "assistant", text, runId: RUN.runId, day: DAY, ...extra });

// ------------------------------------------------------------------ event constructors

const runStarted = (runId = RUN.runId): AGUIEvent => ({ type: EventType.RUN_STARTED, threadId: THREAD, runId });
const runFinished = (runId = RUN.runId): AGUIEvent => ({ type: EventType.RUN_FINISHED, threadId: THREAD, runId });
const start = (messageId: string): AGUIEvent => ({ type: EventType.TEXT_MESSAGE_START, messageId, role: "assistant" });
const content = (messageId: string, delta: string): AGUIEvent => ({ type: EventType.TEXT_MESSAGE_CONTENT, messageId, delta });
const end = (messageId: string): AGUIEvent => ({ type: EventType.TEXT_MESSAGE_END, messageId });
const toolStart = (toolCallId: string, toolCallName: string, parentMessageId?: string): AGUIEvent => ({ type: EventType.TOOL_CALL_START, toolCallId, toolCallName, parentMessageId });
const toolArgs = (toolCallId: string, delta: string): AGUIEvent => ({ type: EventType.TOOL_CALL_ARGS, toolCallId, delta });
const toolEnd = (toolCallId: string): AGUIEvent => ({ type: EventType.TOOL_CALL_END, toolCallId });
const toolResult = (toolCallId: string, messageId: string, result: string): AGUIEvent => ({ type: EventType.TOOL_CALL_RESULT, toolCallId, messageId, content: result });
const custom = (name: string, value: unknown): AGUIEvent => ({ type: EventType.CUSTOM, name, value });

/** A whole run as the server streams it: a step, a message, a tool call with its card, a second message with a file. */
const RUN_EVENTS: AGUIEvent[] = [
  runStarted(),
  { type: EventType.STEP_STARTED, stepName: "plan" },
  start("m1"),
  content("m1", "Let me "),
  content("m1", "look "),
  content("m1", "that up."),
  end("m1"),
  toolStart("tc1", "search", "m1"),
  toolArgs("tc1", '{"query":'),
  toolArgs("tc1", '"weather in '),
  toolArgs("tc1", 'Paris"}'),
  toolEnd("tc1"),
  toolResult("tc1", "r1", "18°C, cloudy"),
  custom("ui_hints", { messageId: "r1", hints: { title: "Paris", status: "success", body: "18°C, cloudy" } }),
  { type: EventType.STATE_DELTA, delta: [{ op: "add", path: "/city", value: "Paris" }] },
  { type: EventType.STEP_FINISHED, stepName: "plan" },
  start("m2"),
  content("m2", "It is 18°C "),
  content("m2", "and cloudy "),
  content("m2", "in Paris."),
  end("m2"),
  custom("attachments", { messageId: "m2", files: [{ path: "out/forecast.pdf", filename: "forecast.pdf", icon_type: "pdf", content_url: "s3://files/out/forecast.pdf" }] }),
  runFinished(),
];

const PARIS_CARD: UiSchemaRenderer = {
  version: "2.0",
  locale: "en-US",
  status: "success",
  theme: "default",
  root: {
    type: "stack",
    appearance: "card",
    children: [
      { type: "text", content: "Paris", role: "title" },
      { type: "badge", label: "SUCCESS", status: "success" },
      { type: "text", content: "18°C, cloudy", role: "body" },
    ],
  },
};

/** What RUN_EVENTS show once the run is over. */
const RUN_ITEMS: ChatItem[] = [
  assistant("run-1:steps", "", { steps: [{ id: "step:plan:0", kind: "step", name: "plan", args: "", status: "done" }] }),
  assistant("m1", "Let me look that up.", {
    streaming: false,
    steps: [{ id: "tc1", kind: "tool", name: "search", args: '{"query":"weather in Paris"}', status: "done", result: "18°C, cloudy", resultMessageId: "r1", ui: PARIS_CARD }],
  }),
  assistant("m2", "It is 18°C and cloudy in Paris.", {
    streaming: false,
    files: [{ name: "forecast.pdf", contentUrl: "s3://files/out/forecast.pdf", icon: "pdf" }],
  }),
];

// ------------------------------------------------------------------ each event type

describe("TEXT_MESSAGE_START", () => {
  it("opens an assistant message of the run, dated today, streaming", () => {
    const { items, terminal, announcement } = apply([], start("m1"));
    expect(items).toEqual([{ key: "m1", role: "assistant", text: "", runId: "run-1", day: DAY, streaming: true }]);
    expect(terminal).toBe(false);
    expect(announcement).toBeNull();
  });

  it("marks a message already shown as streaming and keeps its text and place", () => {
    const before = [assistant("m0", "first"), assistant("m1", "partial")];
    const { items } = apply(before, start("m1"));
    expect(items).toEqual([assistant("m0", "first"), assistant("m1", "partial", { streaming: true })]);
  });
});

describe("TEXT_MESSAGE_CONTENT", () => {
  it("appends the delta to the message's text", () => {
    const { items } = apply([assistant("m1", "Hello", { streaming: true })], content("m1", ", world"));
    expect(items).toEqual([assistant("m1", "Hello, world", { streaming: true })]);
  });

  it("opens the message when its start was not seen", () => {
    const { items } = apply([], content("m1", "Hi"));
    expect(items).toEqual([assistant("m1", "Hi", { streaming: true })]);
  });

  it("finds the message by id whichever run showed it", () => {
    const other: ChatItem = { key: "m1", role: "assistant", text: "a", runId: "run-0", day: "2025-03-03" };
    const { items } = apply([other], content("m1", "b"));
    expect(items).toEqual([{ ...other, text: "ab", streaming: true }]);
  });
});

describe("TEXT_MESSAGE_END", () => {
  it("stops the message streaming and keeps its text", () => {
    const { items } = apply([assistant("m1", "Done.", { streaming: true })], end("m1"));
    expect(items).toEqual([assistant("m1", "Done.", { streaming: false })]);
  });
});

describe("TOOL_CALL_START", () => {
  const running = { id: "tc1", kind: "tool", name: "search", args: "", status: "running" } as const;

  it("adds a running step to its parent message", () => {
    const { items } = apply([assistant("m1", "Looking.")], toolStart("tc1", "search", "m1"));
    expect(items).toEqual([assistant("m1", "Looking.", { steps: [running] })]);
  });

  it("opens the parent message when it is not shown", () => {
    const { items } = apply([], toolStart("tc1", "search", "m9"));
    expect(items).toEqual([assistant("m9", "", { steps: [running] })]);
  });

  it("without a parent, goes on the run's last assistant message, not another run's", () => {
    const before: ChatItem[] = [
      { key: "u1", role: "user", text: "Weather?", runId: "run-1", day: DAY },
      assistant("m1", "one"),
      assistant("m2", "two"),
      { key: "x1", role: "assistant", text: "other run", runId: "run-2", day: DAY },
    ];
    const { items } = apply(before, toolStart("tc1", "search"));
    expect(items.map((i) => i.steps?.length ?? 0)).toEqual([0, 0, 1, 0]);
    expect(items[2].steps).toEqual([running]);
  });

  it("without a parent or an assistant message, goes on the run's steps item", () => {
    const { items } = apply([{ key: "u1", role: "user", text: "Hi", runId: "run-1", day: DAY }], toolStart("tc1", "search"));
    expect(items[1]).toEqual(assistant("run-1:steps", "", { steps: [running] }));
  });
});

describe("TOOL_CALL_ARGS", () => {
  const before = [assistant("m1", "", { steps: [{ id: "tc1", kind: "tool", name: "search", args: '{"q":', status: "running" }] })];

  it("appends the delta to the call's arguments", () => {
    const { items } = apply(before, toolArgs("tc1", '"x"}'));
    expect(items[0].steps![0].args).toBe('{"q":"x"}');
  });

  it("leaves everything as it is for a call it does not know", () => {
    expect(apply(before, toolArgs("tc9", "zzz")).items).toEqual(before);
  });
});

describe("TOOL_CALL_END", () => {
  it("marks the call as called", () => {
    const before = [assistant("m1", "", { steps: [{ id: "tc1", kind: "tool", name: "search", args: "{}", status: "running" }] })];
    expect(apply(before, toolEnd("tc1")).items[0].steps).toEqual([{ id: "tc1", kind: "tool", name: "search", args: "{}", status: "called" }]);
  });
});

describe("TOOL_CALL_RESULT", () => {
  const before = [assistant("m1", "", { steps: [{ id: "tc1", kind: "tool", name: "search", args: "{}", status: "called" }] })];

  it("marks the call done with its result and the result's message id", () => {
    const { items } = apply(before, toolResult("tc1", "r1", "18°C"));
    expect(items[0].steps).toEqual([{ id: "tc1", kind: "tool", name: "search", args: "{}", status: "done", result: "18°C", resultMessageId: "r1" }]);
  });

  it("shows a result of content parts as their JSON", () => {
    const parts = [{ type: "text" as const, text: "18°C" }];
    const { items } = apply(before, { type: EventType.TOOL_CALL_RESULT, toolCallId: "tc1", messageId: "r1", content: parts });
    expect(items[0].steps![0].result).toBe('[{"type":"text","text":"18°C"}]');
  });
});

describe("STEP_STARTED", () => {
  it("adds a running step numbered by the steps its message has", () => {
    const once = apply([assistant("m1", "")], { type: EventType.STEP_STARTED, stepName: "plan" });
    const twice = apply(once.items, { type: EventType.STEP_STARTED, stepName: "plan" });
    expect(twice.items[0].steps).toEqual([
      { id: "step:plan:0", kind: "step", name: "plan", args: "", status: "running" },
      { id: "step:plan:1", kind: "step", name: "plan", args: "", status: "running" },
    ]);
  });

  it("before any message of the run, goes on the run's steps item", () => {
    const { items } = apply([], { type: EventType.STEP_STARTED, stepName: "plan" });
    expect(items).toEqual([assistant("run-1:steps", "", { steps: [{ id: "step:plan:0", kind: "step", name: "plan", args: "", status: "running" }] })]);
  });
});

describe("STEP_FINISHED", () => {
  it("marks the first running step of that name done, and only it", () => {
    const before = [
      assistant("m1", "", {
        steps: [
          { id: "step:plan:0", kind: "step", name: "plan", args: "", status: "done" },
          { id: "step:plan:1", kind: "step", name: "plan", args: "", status: "running" },
          { id: "step:act:2", kind: "step", name: "act", args: "", status: "running" },
          { id: "plan", kind: "tool", name: "plan", args: "", status: "running" },
        ],
      }),
    ];
    const { items } = apply(before, { type: EventType.STEP_FINISHED, stepName: "plan" });
    expect(items[0].steps!.map((s) => s.status)).toEqual(["done", "done", "running", "running"]);
  });

  it("marks it in the first message that runs one, not in later ones", () => {
    const before = [
      assistant("m1", "", { steps: [{ id: "step:plan:0", kind: "step", name: "plan", args: "", status: "running" }] }),
      assistant("m2", "", { steps: [{ id: "tc9", kind: "tool", name: "t", args: "", status: "done" }, { id: "step:plan:1", kind: "step", name: "plan", args: "", status: "running" }] }),
    ];
    const { items } = apply(before, { type: EventType.STEP_FINISHED, stepName: "plan" });
    expect(items.map((i) => i.steps!.map((s) => s.status))).toEqual([["done"], ["done", "running"]]);
  });

  it("leaves everything as it is when no such step runs", () => {
    const before = [assistant("m1", "", { steps: [{ id: "step:plan:0", kind: "step", name: "plan", args: "", status: "done" }] })];
    expect(apply(before, { type: EventType.STEP_FINISHED, stepName: "plan" }).items).toEqual(before);
  });
});

describe("CUSTOM ui_hints", () => {
  const hints = { title: "Paris", status: "success", body: "18°C, cloudy" };

  it("puts the card on the tool step whose result is that message", () => {
    const before = [assistant("m1", "", { steps: [{ id: "tc1", kind: "tool", name: "search", args: "{}", status: "done", result: "18°C", resultMessageId: "r1" }] })];
    const { items } = apply(before, custom("ui_hints", { messageId: "r1", hints }));
    expect(items).toHaveLength(1);
    expect(items[0].steps![0].ui).toEqual(PARIS_CARD);
    expect(items[0].ui).toBeUndefined();
  });

  it("otherwise adds the card to the message, after the cards it has", () => {
    const once = apply([assistant("m1", "Here.")], custom("ui_hints", { messageId: "m1", hints }));
    const twice = apply(once.items, custom("ui_hints", { messageId: "m1", hints: { body: "more" } }));
    expect(twice.items[0].ui).toHaveLength(2);
    expect(twice.items[0].ui![0]).toEqual(PARIS_CARD);
    expect(twice.items[0].ui![1].root).toEqual({ type: "stack", appearance: "card", children: [{ type: "text", content: "more", role: "body" }] });
  });

  it("opens the message when it is not shown", () => {
    const { items } = apply([], custom("ui_hints", { messageId: "m5", hints }));
    expect(items).toEqual([assistant("m5", "", { ui: [PARIS_CARD] })]);
  });

  it("shows nothing for hints that compile to no card, or a value of the wrong shape", () => {
    const before = [assistant("m1", "Here.")];
    expect(apply(before, custom("ui_hints", { messageId: "m1", hints: {} })).items).toEqual(before);
    expect(apply(before, custom("ui_hints", { messageId: "m1" })).items).toEqual(before);
    expect(apply(before, custom("ui_hints", { messageId: 7, hints })).items).toEqual(before);
    expect(apply(before, custom("ui_hints", "card")).items).toEqual(before);
  });
});

describe("CUSTOM attachments", () => {
  it("adds the agent's files to the message, after those it has", () => {
    const before = [assistant("m1", "Files:", { files: [{ name: "a.txt", contentUrl: "s3://b/a.txt" }] })];
    const { items } = apply(before, custom("attachments", { messageId: "m1", files: [{ path: "p/b.pdf", filename: "b.pdf", icon_type: "pdf" }, { path: "p/c.csv", filename: "c.csv", content_url: "s3://b/c.csv" }] }));
    expect(items[0].files).toEqual([
      { name: "a.txt", contentUrl: "s3://b/a.txt" },
      { name: "b.pdf", contentUrl: null, icon: "pdf" },
      { name: "c.csv", contentUrl: "s3://b/c.csv", icon: undefined },
    ]);
  });

  it("ignores a value without a file list", () => {
    const before = [assistant("m1", "Files:")];
    expect(apply(before, custom("attachments", { messageId: "m1", files: "b.pdf" })).items).toEqual(before);
  });
});

describe("CUSTOM interaction_timeout", () => {
  const prompt = (error?: string): ChatItem => ({
    key: "prompt:i1",
    role: "prompt",
    text: "Which city?",
    runId: "run-1",
    day: DAY,
    prompt: { interrupt: { id: "i1", reason: "input_required" }, status: "pending", error },
  });

  it("closes the prompt as timed out with the server's error", () => {
    const { items } = apply([prompt()], custom("interaction_timeout", { promptId: "i1", error: "Too late." }));
    expect(items[0].prompt).toEqual({ interrupt: { id: "i1", reason: "input_required" }, status: "timed_out", error: "Too late." });
  });

  it("keeps the prompt's own error when the event has none", () => {
    const { items } = apply([prompt("Earlier error")], custom("interaction_timeout", { promptId: "i1" }));
    expect(items[0].prompt?.status).toBe("timed_out");
    expect(items[0].prompt?.error).toBe("Earlier error");
  });

  it("shows a notice when the prompt is not shown", () => {
    const { items } = apply([], custom("interaction_timeout", { promptId: "i1" }));
    expect(items).toEqual([{ key: "notice:run-1:timeout", role: "notice", level: "info", text: "A question timed out.", runId: "run-1", day: DAY }]);
    expect(apply([], custom("interaction_timeout", { promptId: "i1", error: "Gone." })).items[0].text).toBe("Gone.");
  });
});

describe("CUSTOM of another name", () => {
  it("leaves everything as it is", () => {
    const before = [assistant("m1", "Hi")];
    const result = apply(before, custom("progress", { messageId: "m1", files: [], hints: { title: "x" } }));
    expect(result).toEqual({ items: before, terminal: false, announcement: null });
  });
});

describe("RUN_STARTED", () => {
  it("changes no item (chat.ts shows a run from elsewhere from its input) and does not end the run", () => {
    const before = [assistant("m1", "Hi", { streaming: true })];
    expect(apply(before, runStarted())).toEqual({ items: before, terminal: false, announcement: null });
  });
});

describe("RUN_FINISHED", () => {
  it("ends the run, stops its streaming messages (not another run's) and says the reply is complete", () => {
    const before = [
      assistant("m1", "Hi", { streaming: true }),
      { key: "x1", role: "assistant" as const, text: "other", runId: "run-2", day: DAY, streaming: true },
      assistant("m2", "done"),
    ];
    const { items, terminal, announcement } = apply(before, runFinished());
    expect(terminal).toBe(true);
    expect(announcement).toBe("Reply complete");
    expect(items.map((i) => i.streaming)).toEqual([false, true, undefined]);
  });

  it("shows each interrupt as a pending prompt, its prompt from the metadata", () => {
    const question = { input_type: "radio", text: "Which city?", options: [{ id: "a", label: "Paris", value: "paris" }] };
    const event: AGUIEvent = {
      type: EventType.RUN_FINISHED,
      threadId: THREAD,
      runId: "run-1",
      outcome: {
        type: "interrupt",
        interrupts: [
          { id: "i1", reason: "input_required", message: "Which city?", expiresAt: "2025-03-04T10:00:00Z", responseSchema: { type: "string" }, metadata: { prompt: question } },
          { id: "i2", reason: "confirm", metadata: { prompt: "not an object" } },
        ],
      },
    };
    const { items, terminal, announcement } = apply([assistant("m1", "Hmm", { streaming: true })], event);
    expect(terminal).toBe(true);
    expect(announcement).toBe("The agent asks you a question");
    expect(items).toEqual([
      assistant("m1", "Hmm", { streaming: false }),
      {
        key: "prompt:i1",
        role: "prompt",
        text: "Which city?",
        runId: "run-1",
        day: DAY,
        prompt: { status: "pending", interrupt: { id: "i1", reason: "input_required", message: "Which city?", expiresAt: "2025-03-04T10:00:00Z", responseSchema: { type: "string" }, metadata: { prompt: question } } },
      },
      { key: "prompt:i2", role: "prompt", text: "", runId: "run-1", day: DAY, prompt: { status: "pending", interrupt: { id: "i2", reason: "confirm" } } },
    ]);
    expect(items[2].prompt!.interrupt).not.toHaveProperty("metadata.prompt");
  });
});

describe("RUN_ERROR", () => {
  it("cancelled: ends the run with a notice that it was stopped", () => {
    const { items, terminal, announcement } = apply([assistant("m1", "Par", { streaming: true })], { type: EventType.RUN_ERROR, message: "cancelled by the user", code: "cancelled" });
    expect(terminal).toBe(true);
    expect(announcement).toBe("Stopped");
    expect(items).toEqual([
      assistant("m1", "Par", { streaming: false }),
      { key: "notice:run-1:stopped", role: "notice", level: "info", text: "Stopped: the agent was cancelled before it finished.", runId: "run-1", day: DAY },
    ]);
  });

  it("otherwise: ends the run with an error notice naming the message, else the code", () => {
    const failed = apply([], { type: EventType.RUN_ERROR, message: "model overloaded", code: "upstream" });
    expect(failed.terminal).toBe(true);
    expect(failed.announcement).toBe("The run failed");
    expect(failed.items).toEqual([{ key: "notice:run-1:error", role: "notice", level: "error", text: "The run failed: model overloaded", runId: "run-1", day: DAY }]);
    expect(apply([], { type: EventType.RUN_ERROR, message: "", code: "upstream" }).items[0].text).toBe("The run failed: upstream");
    expect(apply([], { type: EventType.RUN_ERROR, message: "" }).items[0].text).toBe("The run failed: unknown error");
  });
});

describe("events this client does not show", () => {
  const before = [assistant("m1", "Hi", { streaming: true, steps: [{ id: "tc1", kind: "tool", name: "search", args: "", status: "running" }] })];
  const ignored: [string, AGUIEvent][] = [
    ["STATE_SNAPSHOT", { type: EventType.STATE_SNAPSHOT, snapshot: { city: "Paris" } }],
    ["STATE_DELTA", { type: EventType.STATE_DELTA, delta: [{ op: "replace", path: "/city", value: "Lyon" }] }],
    ["MESSAGES_SNAPSHOT", { type: EventType.MESSAGES_SNAPSHOT, messages: [{ id: "m1", role: "assistant", content: "Hello there" }] }],
    ["TEXT_MESSAGE_CHUNK", { type: EventType.TEXT_MESSAGE_CHUNK, messageId: "m1", delta: " there" }],
    ["TOOL_CALL_CHUNK", { type: EventType.TOOL_CALL_CHUNK, toolCallId: "tc1", delta: "{}" }],
    ["RAW", { type: EventType.RAW, event: { anything: true } }],
  ];

  it.each(ignored)("%s leaves the items as they are", (_, event) => {
    expect(apply(before, event)).toEqual({ items: before, terminal: false, announcement: null });
  });
});

describe("CHUNK events as AG-UI's client hands them on", () => {
  it("are turned into START, CONTENT and END first, and show the same message", async () => {
    const chunks: BaseEvent[] = [
      runStarted(),
      { type: EventType.TEXT_MESSAGE_CHUNK, messageId: "m1", role: "assistant", delta: "Bon" },
      { type: EventType.TEXT_MESSAGE_CHUNK, messageId: "m1", delta: "jour" },
      { type: EventType.TOOL_CALL_CHUNK, toolCallId: "tc1", toolCallName: "search", parentMessageId: "m1", delta: '{"q":' },
      { type: EventType.TOOL_CALL_CHUNK, toolCallId: "tc1", delta: '"x"}' },
      runFinished(),
    ];
    const delivered = (await lastValueFrom(from(chunks).pipe(transformChunks(), toArray()))).filter(isProtocolEvent);
    expect(delivered.map((e) => e.type)).not.toContain(EventType.TEXT_MESSAGE_CHUNK);
    const fromChunks = fold(delivered);
    const fromEvents = fold([runStarted(), start("m1"), content("m1", "Bon"), content("m1", "jour"), end("m1"), toolStart("tc1", "search", "m1"), toolArgs("tc1", '{"q":'), toolArgs("tc1", '"x"}'), toolEnd("tc1"), runFinished()]);
    expect(fromChunks.items).toEqual(fromEvents.items);
    expect(fromChunks.items).toEqual([assistant("m1", "Bonjour", { streaming: false, steps: [{ id: "tc1", kind: "tool", name: "search", args: '{"q":"x"}', status: "called" }] })]);
  });
});

// ------------------------------------------------------------------ sequences

describe("a run streamed", () => {
  it("assembles a message from its deltas, streaming until its end", () => {
    const events = [runStarted(), start("m1"), content("m1", "The "), content("m1", "answer "), content("m1", "is 42.")];
    const during = fold(events);
    expect(during.items).toEqual([assistant("m1", "The answer is 42.", { streaming: true })]);
    expect(during.terminal).toBe(false);
    const after = fold([end("m1"), runFinished()], during.items);
    expect(after.items).toEqual([assistant("m1", "The answer is 42.", { streaming: false })]);
    expect(after.terminal).toBe(true);
    expect(after.announcements).toEqual(["Reply complete"]);
  });

  it("assembles a tool call's arguments across its chunks", () => {
    const { items } = fold([runStarted(), start("m1"), end("m1"), toolStart("tc1", "lookup", "m1"), toolArgs("tc1", '{"city":"Pa'), toolArgs("tc1", 'ris","days"'), toolArgs("tc1", ":3}")]);
    const step = items[0].steps![0];
    expect(step).toEqual({ id: "tc1", kind: "tool", name: "lookup", args: '{"city":"Paris","days":3}', status: "running" });
    expect(JSON.parse(step.args)).toEqual({ city: "Paris", days: 3 });
  });

  it("shows a whole run: its steps, messages, tool call, card and file", async () => {
    await expect(verified(RUN_EVENTS)).resolves.toHaveLength(RUN_EVENTS.length);
    const { items, terminal, announcements } = fold(RUN_EVENTS);
    expect(items).toEqual(RUN_ITEMS);
    expect(terminal).toBe(true);
    expect(announcements).toEqual(["Reply complete"]);
  });

  it("a compacted replay (one CONTENT with the whole text, one ARGS) shows the same as the deltas", () => {
    // Each run of deltas of one message (or one tool call) merged into its first.
    const compacted: AGUIEvent[] = [];
    for (const event of RUN_EVENTS) {
      const last = compacted.at(-1);
      if (event.type === EventType.TEXT_MESSAGE_CONTENT && last?.type === EventType.TEXT_MESSAGE_CONTENT && last.messageId === event.messageId) {
        compacted[compacted.length - 1] = { ...last, delta: last.delta + event.delta };
      } else if (event.type === EventType.TOOL_CALL_ARGS && last?.type === EventType.TOOL_CALL_ARGS && last.toolCallId === event.toolCallId) {
        compacted[compacted.length - 1] = { ...last, delta: last.delta + event.delta };
      } else {
        compacted.push(event);
      }
    }
    expect(compacted.filter((e) => e.type === EventType.TEXT_MESSAGE_CONTENT).map((e) => e.type === EventType.TEXT_MESSAGE_CONTENT && e.delta)).toEqual([
      "Let me look that up.",
      "It is 18°C and cloudy in Paris.",
    ]);
    expect(compacted).toHaveLength(RUN_EVENTS.length - 6);
    expect(fold(compacted).items).toEqual(RUN_ITEMS);
  });

  it("AG-UI's own compaction of the run shows the same as the deltas", () => {
    const compacted = compactEvents(RUN_EVENTS).filter(isProtocolEvent);
    expect(compacted.filter((e) => e.type === EventType.TEXT_MESSAGE_CONTENT)).toHaveLength(2);
    expect(compacted.filter((e) => e.type === EventType.TOOL_CALL_ARGS)).toHaveLength(1);
    expect(fold(compacted).items).toEqual(RUN_ITEMS);
  });

  it("ends with an error notice after what it streamed, its message no longer streaming", () => {
    const { items, terminal, announcements } = fold([runStarted(), start("m1"), content("m1", "Half an ans"), toolStart("tc1", "search", "m1"), { type: EventType.RUN_ERROR, message: "worker lost", code: "internal" }]);
    expect(terminal).toBe(true);
    expect(announcements).toEqual(["The run failed"]);
    expect(items).toEqual([
      assistant("m1", "Half an ans", { streaming: false, steps: [{ id: "tc1", kind: "tool", name: "search", args: "", status: "running" }] }),
      { key: "notice:run-1:error", role: "notice", level: "error", text: "The run failed: worker lost", runId: "run-1", day: DAY },
    ]);
  });
});

describe("a resume", () => {
  it("after a break anywhere (and a reload), repeats nothing: the rest of the stream ends as the whole run", () => {
    for (let cut = 1; cut < RUN_EVENTS.length; cut++) {
      // What the tab keeps across a reload (sessionStorage).
      const kept: ChatItem[] = JSON.parse(JSON.stringify(fold(RUN_EVENTS.slice(0, cut)).items));
      // chat.ts does not apply the openers again (they carry no event number): only the rest.
      const { items, terminal } = fold(RUN_EVENTS.slice(cut), kept);
      expect(items, `cut after event ${cut}`).toEqual(RUN_ITEMS);
      expect(terminal).toBe(true);
    }
  });

  it("joins with openers AG-UI's verifier accepts, after any event of a run without agent steps", async () => {
    const run = RUN_EVENTS.filter((e) => e.type !== EventType.STEP_STARTED && e.type !== EventType.STEP_FINISHED);
    for (let cut = 1; cut < run.length; cut++) {
      const kept: ChatItem[] = JSON.parse(JSON.stringify(fold(run.slice(0, cut)).items));
      const joined = [...openers(kept, THREAD, "run-1"), ...run.slice(cut)];
      await expect(verified(joined), `cut after event ${cut}`).resolves.toHaveLength(joined.length);
    }
  });

  // Known gap, kept as chat.ts had it: the openers do not re-open a running agent step
  // (STEP_STARTED), so AG-UI's verifier refuses the resumed stream's STEP_FINISHED. When the
  // openers learn it, this test fails and becomes a plain `it`.
  it.fails("joins with openers AG-UI's verifier accepts, after an event inside an agent step", async () => {
    const cut = 3; // RUN_STARTED, STEP_STARTED plan, TEXT_MESSAGE_START m1
    const kept = fold(RUN_EVENTS.slice(0, cut)).items;
    const joined = [...openers(kept, THREAD, "run-1"), ...RUN_EVENTS.slice(cut)];
    await expect(verified(joined)).resolves.toHaveLength(joined.length);
  });

  it("opens again exactly the run's streaming messages and running tool calls", () => {
    const items: ChatItem[] = [
      assistant("m1", "done"),
      assistant("m2", "stream", { streaming: true, steps: [{ id: "tc1", kind: "tool", name: "a", args: "{", status: "running" }, { id: "tc2", kind: "tool", name: "b", args: "{}", status: "called" }, { id: "step:x:2", kind: "step", name: "x", args: "", status: "running" }] }),
      { key: "o1", role: "assistant", text: "other", runId: "run-2", day: DAY, streaming: true },
    ];
    expect(openers(items, THREAD, "run-1")).toEqual([
      { type: EventType.RUN_STARTED, threadId: THREAD, runId: "run-1" },
      { type: EventType.TEXT_MESSAGE_START, messageId: "m2", role: "assistant" },
      { type: EventType.TOOL_CALL_START, toolCallId: "tc1", toolCallName: "a", parentMessageId: "m2" },
    ]);
  });

  it("sent the question again (a fresh snapshot) shows it once", () => {
    const asked: AGUIEvent = { type: EventType.RUN_FINISHED, threadId: THREAD, runId: "run-1", outcome: { type: "interrupt", interrupts: [{ id: "i1", reason: "input_required", message: "Which city?" }] } };
    const { items } = fold([runStarted(), start("m1"), content("m1", "One question."), end("m1"), asked, asked]);
    expect(items.map((i) => i.key)).toEqual(["m1", "prompt:i1"]);
  });
});

// ------------------------------------------------------------------ helpers

describe("isProtocolEvent", () => {
  it("knows the protocol's event types and no other", () => {
    expect(isProtocolEvent(runStarted())).toBe(true);
    expect(isProtocolEvent({ type: "TEXT_MESSAGE_DELTA" } as unknown as BaseEvent)).toBe(false);
  });
});

describe("isCustom", () => {
  it("checks each Switchboard CUSTOM value's fields", () => {
    expect(isCustom("ui_hints", { messageId: "m1", hints: {} })).toBe(true);
    expect(isCustom("ui_hints", { messageId: "m1", hints: null })).toBe(false);
    expect(isCustom("attachments", { messageId: "m1", files: [] })).toBe(true);
    expect(isCustom("attachments", { files: [] })).toBe(false);
    expect(isCustom("interaction_timeout", { promptId: "i1" })).toBe(true);
    expect(isCustom("interaction_timeout", null)).toBe(false);
  });
});

describe("promptInterrupt and generatedFile", () => {
  it("keep what the view reads", () => {
    expect(promptInterrupt({ id: "i1", reason: "r", metadata: { prompt: { input_type: "text", text: "Name?" }, other: 1 } })).toEqual({
      id: "i1",
      reason: "r",
      metadata: { prompt: { input_type: "text", text: "Name?" } },
    });
    expect(generatedFile({ path: "a/b.csv", filename: "b.csv", icon_type: "csv", source: "generated", content_url: "s3://x/a/b.csv" })).toEqual({ name: "b.csv", contentUrl: "s3://x/a/b.csv", icon: "csv" });
  });
});
