// The AI SDK's own client against a live scope.web server: DefaultChatTransport posts
// the request and validates every part against the SDK's schema; readUIMessageStream
// assembles the message. Prints {message, errors} as JSON.
//   node ui_client.mjs BASE_URL PATH [resume CHAT_ID RELEASE_PATH]
// The ai package: this folder's (ai 6), or the module SCOPE_AI_MODULE names (ai7/ai.mjs).
const { DefaultChatTransport, readUIMessageStream } = await import(process.env.SCOPE_AI_MODULE ?? "ai");

const [base, path, mode, chatId, releasePath] = process.argv.slice(2);
const transport = new DefaultChatTransport({ api: `${base}${path}` });
const errors = [];
// In resume mode the question names the chat (the test's model waits on it).
const text = mode === "resume" ? chatId : "Hi there";
const user = { id: "u1", role: "user", parts: [{ type: "text", text }] };

const abort = new AbortController();

// The message as the stream left it; with a limit, as it was after `limit` updates,
// when the connection is dropped (abort). The loop then runs to its end rather than
// breaking out: ai 7's readUIMessageStream throws an uncaught "Controller is already
// closed" when its reader stops early and the stream ends afterwards.
async function read(stream, limit = Infinity) {
  let last = null;
  let seen = 0;
  let dropped = false;
  for await (const message of readUIMessageStream({
    stream,
    onError: (error) => {
      if (!dropped) errors.push(String(error?.message ?? error));
    },
  })) {
    if (dropped) continue; // what still arrives is not read
    last = message;
    if (++seen >= limit) {
      dropped = true;
      abort.abort();
    }
  }
  return last;
}

const stream = await transport.sendMessages({
  chatId: chatId ?? "chat-1",
  messages: [user],
  trigger: "submit-message",
  messageId: undefined,
  abortSignal: abort.signal,
});
let message;
if (mode === "resume") {
  // Read a little, drop the connection, let the turn go on, come back for the rest.
  const partial = await read(stream, 2);
  await fetch(`${base}${releasePath}`, { method: "POST" });
  const again = await transport.reconnectToStream({ chatId });
  if (again === null) throw new Error("the server had no stream to resume");
  message = await read(again);
  console.log(JSON.stringify({ partial, message, errors }));
} else {
  message = await read(stream);
  console.log(JSON.stringify({ message, errors }));
}
