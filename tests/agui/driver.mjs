// Drives a two-turn conversation with AG-UI's own HttpAgent (@ag-ui/client), unchanged,
// against the runs service's AG-UI route, and prints what the client saw as one JSON line.
//
// Environment: SB_AGUI_URL (the route), SB_TOKEN (bearer token), SB_THREAD_ID, SB_TURNS
// (JSON array of user texts), SB_ANSWER (optional: after the turns, every interrupt the client
// holds is answered with this payload through the client's own `resume`). The client's own
// verifier checks the event order; a run that breaks it rejects and this script exits 1.
import { HttpAgent, buildResumeArray } from "@ag-ui/client";

const url = process.env.SB_AGUI_URL;
const token = process.env.SB_TOKEN;
const threadId = process.env.SB_THREAD_ID;
const turns = JSON.parse(process.env.SB_TURNS ?? "[]");

const agent = new HttpAgent({
  url,
  threadId,
  headers: { Authorization: `Bearer ${token}` },
});

const report = { turns: [] };
try {
  for (const [i, text] of turns.entries()) {
    const events = [];
    agent.addMessage({ id: `${threadId}-user-${i}`, role: "user", content: text });
    const { newMessages } = await agent.runAgent(
      { runId: `${threadId}-run-${i}` },
      { onEvent: ({ event }) => events.push(event) },
    );
    report.turns.push({ events, newMessages });
  }
  report.pendingInterrupts = agent.pendingInterrupts;
  if (process.env.SB_ANSWER !== undefined && agent.pendingInterrupts.length > 0) {
    const answers = Object.fromEntries(
      agent.pendingInterrupts.map((i) => [i.id, { status: "resolved", payload: process.env.SB_ANSWER }]),
    );
    const events = [];
    const { newMessages } = await agent.runAgent(
      { runId: `${threadId}-resume`, resume: buildResumeArray(agent.pendingInterrupts, answers) },
      { onEvent: ({ event }) => events.push(event) },
    );
    report.resumed = { events, newMessages, pendingAfter: agent.pendingInterrupts };
  }
  report.messages = agent.messages;
  process.stdout.write(JSON.stringify(report) + "\n");
} catch (err) {
  process.stderr.write(`HttpAgent failed: ${err?.stack ?? err}\n`);
  process.exit(1);
}
