// The AI SDK's own chat logic (AbstractChat: what useChat runs) against a live scope.web
// service: sendMessage, sendMessage({messageId}) (an edit) and regenerate() build the
// requests exactly as a browser's chat would. Steps, in order, from argv:
//   send:TEXT         a new user message
//   edit:N:TEXT       replace the N-th user message (0-based) with TEXT
//   regenerate        a new answer to the last question
//   regenerate:N      a new answer to the N-th assistant message (0-based)
//   resend:TEXT       a new user message whose request is posted twice, the same body:
//                     the first answer is read to its end and dropped (the connection
//                     was lost), the chat gets the second
// Prints {steps: [{messages: [{role, text}], error}]} as JSON.
//   node chat_client.mjs BASE_URL CHAT_ID STEP...
// The ai package: this folder's (ai 6), or the module SCOPE_AI_MODULE names (ai7/ai.mjs).
const { AbstractChat, DefaultChatTransport } = await import(process.env.SCOPE_AI_MODULE ?? "ai");

const [base, chatId, ...steps] = process.argv.slice(2);

class State {
  constructor() {
    this.status = "ready";
    this.error = undefined;
    this.messages = [];
  }
  pushMessage(message) {
    this.messages = this.messages.concat(message);
  }
  popMessage() {
    this.messages = this.messages.slice(0, -1);
  }
  replaceMessage(index, message) {
    this.messages = [...this.messages.slice(0, index), message, ...this.messages.slice(index + 1)];
  }
  snapshot(thing) {
    return structuredClone(thing);
  }
}

class Chat extends AbstractChat {
  constructor(options) {
    super({ ...options, state: new State() });
  }
}

let failure = null;
let resend = false;
const posted = [];
async function fetchTwice(url, init) {
  posted.push(init?.body);
  if (resend && init?.method === "POST") {
    const lost = await fetch(url, init);
    await lost.text(); // the server finished; the client never saw it
    posted.push(init.body);
  }
  return fetch(url, init);
}
const chat = new Chat({
  id: chatId,
  transport: new DefaultChatTransport({ api: `${base}/api/chat`, fetch: fetchTwice }),
  onError: (error) => {
    failure = String(error?.message ?? error);
  },
});

const text = (message) =>
  message.parts
    .filter((part) => part.type === "text")
    .map((part) => part.text)
    .join("");

const results = [];
for (const step of steps) {
  failure = null;
  const [kind, ...rest] = step.split(":");
  resend = kind === "resend";
  if (kind === "send" || kind === "resend") {
    await chat.sendMessage({ text: rest.join(":") });
  } else if (kind === "edit") {
    const users = chat.messages.filter((message) => message.role === "user");
    const target = users[Number(rest[0])];
    await chat.sendMessage({ text: rest.slice(1).join(":"), messageId: target.id });
  } else if (kind === "regenerate") {
    const answers = chat.messages.filter((message) => message.role === "assistant");
    const messageId = rest.length ? answers[Number(rest[0])].id : undefined;
    await chat.regenerate(messageId === undefined ? {} : { messageId });
  } else {
    throw new Error(`unknown step ${step}`);
  }
  results.push({
    messages: chat.messages.map((message) => ({ role: message.role, text: text(message) })),
    error: failure ?? (chat.error ? String(chat.error.message ?? chat.error) : null),
  });
}
const same = posted.length >= 2 && posted.at(-1) === posted.at(-2);
console.log(JSON.stringify({ steps: results, lastBodyPostedTwice: same }));
