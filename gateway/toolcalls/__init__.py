"""Forced tool calls: when a request makes the model call a tool, what the call says.

- `arguments`: a call's arguments synthesized from the tool's JSON schema (deterministic,
  seeded), as the JSON text that grows by one fragment per generated token.
- `choice`: which tool a request forces, read from each API's `tools` and `tool_choice`
  (OpenAI chat, Anthropic Messages, OpenAI Responses); a named tool that is not in `tools`
  is a 400 naming the field.

Knows no API's response shapes (each dialect in `gateway.protocols` renders the call) and
no HTTP, gRPC or engine.
"""

from inference_lab.gateway.toolcalls.arguments import Arguments, synthesize
from inference_lab.gateway.toolcalls.choice import (
    ForcedCall, chat_forced, messages_forced, responses_forced,
)

__all__ = ["Arguments", "ForcedCall", "chat_forced", "messages_forced", "responses_forced",
           "synthesize"]
