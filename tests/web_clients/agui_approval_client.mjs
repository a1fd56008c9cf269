// @ag-ui/client's HttpAgent through a tool approval: the first run ends with
// RUN_FINISHED's interrupt outcome (agent.pendingInterrupts), the second resumes it
// (runAgent({resume})) with the decision. Every event is enforced and verified.
// Prints {interrupts, first, messages, events, error} as JSON.
//   node agui_approval_client.mjs URL THREAD_ID ORDER approve|deny|cancel [REASON]
import { HttpAgent } from "@ag-ui/client";

const [url, threadId, order, decision, reason] = process.argv.slice(2);
const agent = new HttpAgent({
  url,
  threadId,
  initialMessages: [{ id: "u1", role: "user", content: order }],
});
let error = null;
console.error = () => {}; // runAgent logs a failed run before it rethrows it

async function run(runId, resume) {
  const events = [];
  try {
    await agent.runAgent(
      { runId, ...(resume === undefined ? {} : { resume }) },
      {
        onEvent: ({ event }) => {
          events.push(event.type);
        },
        onRunErrorEvent: ({ event }) => {
          error = event.message;
        },
      },
    );
  } catch (exc) {
    error = error ?? `client error: ${exc?.message ?? exc}`;
  }
  return events;
}

const first = await run("run-1");
const interrupts = structuredClone(agent.pendingInterrupts ?? []);
let events = [];
if (error === null && interrupts.length > 0) {
  const resume = interrupts.map((interrupt) =>
    decision === "cancel"
      ? { interruptId: interrupt.id, status: "cancelled" }
      : {
          interruptId: interrupt.id,
          status: "resolved",
          payload: {
            approved: decision === "approve",
            ...(reason === undefined ? {} : { reason }),
          },
        },
  );
  events = await run("run-2", resume);
}
console.log(
  JSON.stringify({
    interrupts,
    first,
    messages: agent.messages,
    events,
    pending: agent.pendingInterrupts ?? null,
    error,
  }),
);
