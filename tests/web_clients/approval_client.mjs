// The AI SDK's own chat logic (AbstractChat: what useChat runs) through a tool approval:
// sendMessage asks for a refund, the stream ends with a tool-approval-request part per
// call, addToolApprovalResponse answers each and the chat sends the decisions by itself
// (sendAutomaticallyWhen: lastAssistantMessageIsCompleteWithApprovalResponses), reading
// the resumed answer. Prints {waiting, messages, requests, error} as JSON: the message
// parts while the call waits, then after the decision.
//   node approval_client.mjs BASE_URL CHAT_ID ORDERS approve|deny [REASON]
// (ORDERS: one order, or several separated by commas: one call each)
// The ai package: this folder's (ai 6), or the module SCOPE_AI_MODULE names (ai7/ai.mjs).
const { AbstractChat, DefaultChatTransport, lastAssistantMessageIsCompleteWithApprovalResponses } =
  await import(process.env.SCOPE_AI_MODULE ?? "ai");

const [base, chatId, order, decision, reason] = process.argv.slice(2);

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
let finished = 0;
let onFinished = () => {};
const requests = [];
async function recording(url, init) {
  requests.push(JSON.parse(init.body));
  return fetch(url, init);
}
const chat = new Chat({
  id: chatId,
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

const view = () =>
  chat.messages.map((message) => ({ id: message.id, role: message.role, parts: message.parts }));

await chat.sendMessage({ text: order });
const waiting = view();
const asked = chat.messages
  .at(-1)
  .parts.filter((candidate) => candidate.state === "approval-requested");
if (asked.length === 0) {
  console.log(JSON.stringify({ waiting, messages: waiting, requests, error: failure ?? "no approval asked" }));
} else {
  // The automatic request runs in the background, once every call is answered: wait
  // for its onFinish (or its error).
  const resumed = new Promise((resolve) => {
    onFinished = resolve;
  });
  for (const part of asked) {
    await chat.addToolApprovalResponse({
      id: part.approval.id,
      approved: decision === "approve",
      ...(reason === undefined ? {} : { reason }),
    });
  }
  if (finished < 2) await resumed;
  console.log(JSON.stringify({ waiting, messages: view(), requests, error: failure }));
}
