// ai 7 for the client scripts one folder up: they import this module when
// SCOPE_AI_MODULE names it (tests/web/test_web_clients.py), and "ai" resolves here.
export * from "ai";
