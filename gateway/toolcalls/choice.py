"""Which tool a request forces the model to call, in each API's words.

Knows: OpenAI chat's `tool_choice` ("none", "auto", "required", `{"type": "function",
"function": {"name"}}`, `{"type": "allowed_tools", "allowed_tools": {"mode", "tools"}}`)
over `tools` of `{"type": "function", "function": {"name", "parameters"}}`; Anthropic's
(`{"type": "auto" | "any" | "tool" | "none", "name"}`) over `tools` of `{"name",
"input_schema"}`; the Responses API's (chat's strings, `{"type": "function", "name"}`,
`{"type": "allowed_tools", "mode", "tools"}`) over `tools` of `{"type": "function",
"name", "parameters"}`. "auto" (or none given) and "none" force nothing: the lab never
decides to call a tool on its own. "required" / "any" force the first function tool. A
forced tool that is not in `tools`, or a forced call without a function tool, is a 400
naming the field.

Does not know: how a dialect renders the call (`gateway.protocols`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from inference_lab.gateway.errors import ErrorKind, GatewayError
from inference_lab.gateway.toolcalls.arguments import Arguments, synthesize

_NAME_SHOWN = 64  # characters of a client's tool name echoed in an error message


@dataclass(frozen=True, slots=True)
class ForcedCall:
    """The call a reply makes: the tool's name and its arguments."""

    name: str
    arguments: Arguments


def invalid(message: str, where: str) -> GatewayError:
    return GatewayError(ErrorKind.INVALID_REQUEST, f"Invalid request body: {message} - at `{where}`")


def _tool_list(tools: Any) -> list:
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise invalid("`tools` must be an array of tool objects", "$.tools")
    return tools


def _call(functions: list[tuple[str, Any]], name: str | None, where: str, seed: Any,
          fragment: str) -> ForcedCall:
    """The call to `name` (None: the first function) among (name, parameters schema)."""
    if not functions:
        raise invalid("`tool_choice` forces a tool call, but `tools` holds no function tool",
                      where)
    if name is None:
        name, schema = functions[0]
    else:
        schemas = [s for n, s in functions if n == name]
        if not schemas:
            shown = name if len(name) <= _NAME_SHOWN else name[:_NAME_SHOWN] + "..."
            raise invalid(f"`tool_choice` names the tool '{shown}', which is not in `tools`",
                          where)
        schema = schemas[0]
    return ForcedCall(name, synthesize(schema, f"{seed}:{name}", fragment))


def _name(obj: Any, where: str) -> str:
    name = obj.get("name") if isinstance(obj, dict) else None
    if not isinstance(name, str):
        raise invalid("a tool name (a string) is required", where)
    return name


def _mode(value: Any, where: str, forcing: str) -> bool:
    """Whether a string `tool_choice` forces a call ("auto" and "none" do not)."""
    if value in ("auto", "none"):
        return False
    if value == forcing:
        return True
    raise invalid(f"`tool_choice` must be 'none', 'auto', '{forcing}' or an object, "
                  f"got {str(value)[:_NAME_SHOWN]!r}", where)


# ---- OpenAI chat completions ----------------------------------------------------------------


def _chat_functions(tools: Any) -> list[tuple[str, Any]]:
    out = []
    for i, tool in enumerate(_tool_list(tools)):
        if isinstance(tool, dict) and tool.get("type", "function") == "function":
            fn = tool.get("function")
            out.append((_name(fn, f"$.tools[{i}].function.name"), fn.get("parameters")))
    return out


def chat_forced(tools: Any, choice: Any, seed: Any, fragment: str) -> ForcedCall | None:
    """The call a chat completions request forces (None: it forces none)."""
    return _openai_forced(tools, choice, seed, fragment, chat=True)


def _openai_forced(tools: Any, choice: Any, seed: Any, fragment: str,
                   chat: bool) -> ForcedCall | None:
    """Chat's and the Responses API's `tool_choice`: the same choices, except that chat
    nests a function's name in `function` and the allowed tools in `allowed_tools`."""
    if choice is None:
        return None
    functions = _chat_functions if chat else _responses_functions
    if isinstance(choice, str):
        if not _mode(choice, "$.tool_choice", "required"):
            return None
        return _call(functions(tools), None, "$.tool_choice", seed, fragment)
    kind = choice.get("type")
    if kind == "function":
        where = "$.tool_choice.function.name" if chat else "$.tool_choice.name"
        name = _name(choice.get("function") if chat else choice, where)
        return _call(functions(tools), name, where, seed, fragment)
    if kind == "allowed_tools":
        allowed = choice.get("allowed_tools") if chat else choice
        allowed = allowed if isinstance(allowed, dict) else {}
        where = "$.tool_choice.allowed_tools" if chat else "$.tool_choice"
        if not _mode(allowed.get("mode"), where + ".mode", "required"):
            return None
        listed_tools = allowed.get("tools")
        if not isinstance(listed_tools, (list, type(None))):
            raise invalid("`tools` of allowed tools must be an array of tool objects",
                          where + ".tools")
        names = set()
        for tool in listed_tools or ():
            named = tool.get("function") if chat and isinstance(tool, dict) else tool
            if isinstance(named, dict) and isinstance(named.get("name"), str):
                names.add(named["name"])
        listed = [f for f in functions(tools) if f[0] in names]
        if names and not listed:
            raise invalid("`tool_choice` allows only tools that are not in `tools`",
                          where + ".tools")
        return _call(listed, None, where + ".tools", seed, fragment)
    raise invalid(f"`tool_choice` of type {str(kind)[:_NAME_SHOWN]!r} is not supported "
                  "(this lab calls function tools only)", "$.tool_choice.type")


# ---- Anthropic Messages -------------------------------------------------------------------------


def _messages_tools(tools: Any) -> list[tuple[str, Any, bool]]:
    """(name, input_schema, whether it is a client tool) of each tool."""
    out = []
    for i, tool in enumerate(_tool_list(tools)):
        name = _name(tool, f"$.tools[{i}].name")
        out.append((name, tool.get("input_schema"), "input_schema" in tool))
    return out


def messages_forced(tools: Any, choice: Any, seed: Any, fragment: str) -> ForcedCall | None:
    """The call a Messages request forces: `{"type": "any"}` the first client tool,
    `{"type": "tool", "name"}` that one."""
    if choice is None:
        return None
    kind = choice.get("type")
    if kind in ("auto", "none"):
        return None
    listed = _messages_tools(tools)
    if kind == "any":
        return _call([(n, s) for n, s, client in listed if client], None, "$.tool_choice",
                     seed, fragment)
    if kind == "tool":
        name = _name(choice, "$.tool_choice.name")
        return _call([(n, s) for n, s, _ in listed], name, "$.tool_choice.name", seed, fragment)
    raise invalid("`tool_choice.type` must be 'auto', 'any', 'tool' or 'none'",
                  "$.tool_choice.type")


# ---- OpenAI Responses ---------------------------------------------------------------------------


def _responses_functions(tools: Any) -> list[tuple[str, Any]]:
    out = []
    for i, tool in enumerate(_tool_list(tools)):
        if isinstance(tool, dict) and tool.get("type") == "function":
            out.append((_name(tool, f"$.tools[{i}].name"), tool.get("parameters")))
    return out


def responses_forced(tools: Any, choice: Any, seed: Any, fragment: str) -> ForcedCall | None:
    """The call a Responses request forces (None: it forces none)."""
    return _openai_forced(tools, choice, seed, fragment, chat=False)
