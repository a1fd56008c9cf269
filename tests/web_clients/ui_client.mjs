// The AI SDK's own client against a live scope.web server: DefaultChatTransport posts
// the request and validates every part against the SDK's schema; readUIMessageStream
// assembles the message. Prints {message, errors} as JSON.
//   node ui_client.mjs BASE_URL PATH [resume CHAT_ID RELEASE_PATH]
import { DefaultChatTransport, readUIMessageStream } from "ai";

const [base, path, mode, chatId, releasePath] = process.argv.slice(2);
const transport = new DefaultChatTransport({ api: `${base}${path}` });
const errors = [];
// In resume mode the question names the chat (the test's model waits on it).
const text = mode === "resume" ? chatId : "Hi there";
const user = { id: "u1", role: "user", parts: [{ type: "text", text }] };

async function read(stream, limit = Infinity) {
  let last = null;
  let seen = 0;
  for await (const message of readUIMessageStream({
    stream,
    onError: (error) => errors.push(String(error?.message ?? error)),
  })) {
    last = message;
    if (++seen >= limit) break;
  }
  return last;
}

const abort = new AbortController();
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
  abort.abort();
  await fetch(`${base}${releasePath}`, { method: "POST" });
  const again = await transport.reconnectToStream({ chatId });
  if (again === null) throw new Error("the server had no stream to resume");
  message = await read(again);
  console.log(JSON.stringify({ partial, message, errors }));
} else {
  message = await read(stream);
  console.log(JSON.stringify({ message, errors }));
}
