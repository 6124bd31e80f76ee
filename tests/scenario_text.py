"""Scenario files for the experiment tests: the closed-loop load most of them run (fixed
prompt and reply lengths, gpt-oss-20b, a fixed limit), written in one place."""

from __future__ import annotations


def closed_loop(name: str, duration: float, users: int, *, limit: int | None = None,
                prompt: int = 16, output: int = 100, window: float | None = None,
                server: str = "", load: str = "", more: str = "") -> str:
    """A scenario's TOML: `users` closed-loop users for `duration` modelled seconds, behind
    the `fixed` controller at `limit` (None: no [controller] table); `server` and `load`
    are lines added to those tables (no [server] table without them), `more` the tables
    after (a timeline, a fleet)."""
    lines = [f'name = "{name}"', f"duration = {duration}", 'model = "gpt-oss-20b"']
    if window is not None:
        lines.append(f"window = {window}")
    if server:
        lines += ["[server]", server.strip()]
    lines += ["[load]", 'arrival_pattern = "closed_loop"', f"num_concurrent_users = {users}",
              f'input_len_dist = {{ type = "fixed", value = {prompt} }}',
              f'output_len_dist = {{ type = "fixed", value = {output} }}']
    if load:
        lines.append(load.strip())
    if limit is not None:
        lines += ["[controller]", 'name = "fixed"', f"params = {{ limit = {limit} }}"]
    if more:
        lines.append(more.strip())
    return "\n".join(lines) + "\n"
