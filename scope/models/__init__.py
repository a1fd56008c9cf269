"""Model adapters: ``chat.Model`` and ``chat.Streamer`` implementations for real providers.

Each adapter lives in its own module and needs its own extra, so importing ``scope`` (or
this package) never imports an HTTP library:

- ``scope.models.openai.OpenAIChatModel`` (extra ``scope-chat[openai]``): the OpenAI Chat
  Completions wire protocol, spoken by OpenAI and by compatible servers (vLLM, Ollama,
  llama.cpp, DeepSeek, ...).
- ``scope.models.anthropic.AnthropicModel`` (extra ``scope-chat[anthropic]``): the Anthropic
  Messages API, spoken natively (no SDK).
- ``scope.models.gemini.GeminiModel`` (extra ``scope-chat[gemini]``): the Google Gemini
  API's ``generateContent``, spoken natively (no SDK).
"""

__all__: list[str] = []
