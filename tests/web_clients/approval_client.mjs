// The AI SDK's own chat logic (AbstractChat: what useChat runs) through a tool approval:
// sendMessage asks for a refund, the stream ends with a tool-approval-request part per
// call, addToolApprovalResponse answers each and the chat sends the decisions by itself
// (sendAutomaticallyWhen: lastAssistantMessageIsCompleteWithApprovalResponses), reading
// the resumed answer. Prints {waiting, replayed, dropped, messages, requests, error} as
// JSON: the message parts while the call waits, then after the decision.
//   node approval_client.mjs BASE_URL CHAT_ID ORDERS approve|deny [REASON]
//        [--reload] [--drop=RELEASE_PATH]
// (ORDERS: one order, or several separated by commas: one call each). With --reload the
// page is reloaded while the calls wait: a new chat holding only the user message
// resumes the stream (resumeStream: the GET of useChat's resume: true), shows what it
// replays (`replayed`) and decides there. With --drop the connection of the decided
// turn is dropped once its answer shows (stop(): `dropped` is the message then), the
// server's model is let go on (a POST to RELEASE_PATH), and the chat resumes the
// stream (resumeStream).
// The ai package: this folder's (ai 6), or the module SCOPE_AI_MODULE names (ai7/ai.mjs).
const { AbstractChat, DefaultChatTransport, lastAssistantMessageIsCompleteWithApprovalResponses } =
  await import(process.env.SCOPE_AI_MODULE ?? "ai");

const flags = process.argv.slice(2).filter((arg) => arg.startsWith("--"));
const reload = flags.includes("--reload");
const releasePath = flags.find((flag) => flag.startsWith("--drop="))?.slice("--drop=".length);
const [base, chatId, order, decision, reason] = process.argv
  .slice(2)
  .filter((arg) => !arg.startsWith("--"));

// Resolved once an assistant message shows text (with --drop: the decided turn answers).
let onAnswer = () => {};
const answering = new Promise((resolve) => {
  onAnswer = resolve;
});
const answers = (message) =>
  message.role === "assistant" && message.parts.some((part) => part.type === "text" && part.text);

class State {
  constructor(messages) {
    this.status = "ready";
    this.error = undefined;
    this.messages = messages;
  }
  pushMessage(message) {
    this.messages = this.messages.concat(message);
  }
  popMessage() {
    this.messages = this.messages.slice(0, -1);
  }
  replaceMessage(index, message) {
    this.messages = [...this.messages.slice(0, index), message, ...this.messages.slice(index + 1)];
    if (answers(message)) onAnswer();
  }
  snapshot(thing) {
    return structuredClone(thing);
  }
}

class Chat extends AbstractChat {
  constructor({ messages, ...options }) {
    super({ ...options, state: new State(messages) });
  }
}

let failure = null;
let finished = 0;
let onFinished = () => {};
const requests = [];
async function recording(url, init) {
  if (init?.body !== undefined) requests.push(JSON.parse(init.body)); // the POSTs
  return fetch(url, init);
}
const newChat = (messages) =>
  new Chat({
    id: chatId,
    messages,
    transport: new DefaultChatTransport({ api: `${base}/api/chat`, fetch: recording }),
    sendAutomaticallyWhen: lastAssistantMessageIsCompleteWithApprovalResponses,
    onError: (error) => {
      failure = String(error?.message ?? error);
      onFinished();
    },
    onFinish: () => {
      finished += 1;
      onFinished();
    },
  });

let chat = newChat([]);
const view = () =>
  chat.messages.map((message) => ({ id: message.id, role: message.role, parts: message.parts }));

await chat.sendMessage({ text: order });
const waiting = view();
let replayed = null;
if (reload && failure === null) {
  chat = newChat(chat.messages.slice(0, 1));
  await chat.resumeStream();
  replayed = view();
}
const asked = chat.messages
  .at(-1)
  .parts.filter((candidate) => candidate.state === "approval-requested");
const decide = async () => {
  for (const part of asked) {
    await chat.addToolApprovalResponse({
      id: part.approval.id,
      approved: decision === "approve",
      ...(reason === undefined ? {} : { reason }),
    });
  }
};
let dropped = null;
if (asked.length === 0) {
  failure ??= "no approval asked";
} else if (releasePath !== undefined) {
  await decide();
  await answering; // the decided turn's answer has begun: the model waits for the release
  dropped = view();
  await chat.stop();
  await fetch(`${base}${releasePath}`, { method: "POST" });
  await chat.resumeStream();
} else {
  // The automatic request runs in the background, once every call is answered: wait
  // for its onFinish (or its error).
  const before = finished;
  const resumed = new Promise((resolve) => {
    onFinished = resolve;
  });
  await decide();
  if (finished === before && failure === null) await resumed;
}
console.log(JSON.stringify({ waiting, replayed, dropped, messages: view(), requests, error: failure }));
