// @ag-ui/client's HttpAgent against a live scope.web server: runAgent enforces and
// verifies every event (verifyEvents) and applies them to the agent's messages.
// Prints {messages, events, error} as JSON.
//   node agui_client.mjs URL [THREAD_ID MESSAGES_JSON [RUN_ID]]
import { HttpAgent } from "@ag-ui/client";

const [url, threadId, messages, runId] = process.argv.slice(2);
const agent = new HttpAgent({
  url,
  threadId: threadId ?? "thread-1",
  initialMessages: messages
    ? JSON.parse(messages)
    : [{ id: "u1", role: "user", content: "Hi there" }],
});
const events = [];
let error = null;
console.error = () => {}; // runAgent logs a failed run before it rethrows it
try {
  await agent.runAgent(
    { runId: runId ?? "run-1" },
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
console.log(JSON.stringify({ messages: agent.messages, events, error }));
