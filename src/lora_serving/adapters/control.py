"""`adapter_command` requests: an operator's handle on a model's adapters, through Triton.

The command travels as the model's `adapter_command` input (Triton refuses a request without
inputs, so it is an input rather than a request parameter) and is answered in `text_output` as
JSON. Any Triton client can send it: tritonclient over gRPC, or HTTP's generate endpoint with
`{"adapter_command": "list"}`.

  list               the adapters: rank, target modules, path, source, state, version
  rescan             reconcile with multi_lora.json and the adapter roots now
  load NAME [PATH]   load or replace NAME from PATH (inside an adapter root; relative to the
                     first root); without PATH, reload NAME from its root or multi_lora.json
  unload NAME        stop serving NAME (running requests finish on it)

model.json `serving.adapters.control` decides what is allowed: "off", "list" (list and rescan:
they only read what the operator already put in place) or "full". With
`serving.adapters.control_token_env` set, `load` and `unload` are refused unless the request
carries that variable's token as its `control_token` parameter, and `list` and `rescan` without
the token answer names only: then "full" is safe on a port tenants reach.
"""

import hashlib
import hmac
import os
import shlex
from dataclasses import dataclass
from typing import Any

from lora_serving.errors import InvalidRequest

USAGE = "list | rescan | load NAME [PATH] | unload NAME"
# verb -> (fewest arguments, most arguments, control level it needs)
_COMMANDS = {
    "list": (0, 0, "list"),
    "rescan": (0, 0, "list"),
    "load": (1, 2, "full"),
    "unload": (1, 1, "full"),
}


@dataclass(frozen=True)
class AdapterCommand:
    verb: str
    args: tuple[str, ...] = ()
    authorized: bool = True  # False: no valid control token (list shows names only)


TOKEN_PARAMETER = "control_token"


@dataclass(frozen=True)
class ControlToken:
    """The token fleet changes need. `required` False: none configured (everything allowed);
    `digest` None while required: the variable is empty, so nothing is allowed."""

    required: bool = False
    digest: bytes | None = None
    variable: str = ""

    @classmethod
    def from_environment(cls, variable: str | None, environ=os.environ) -> "ControlToken":
        if not variable:
            return cls()
        token = environ.get(variable, "")
        digest = hashlib.sha256(token.encode()).digest() if token else None
        return cls(True, digest, variable)

    def accepts(self, presented: object) -> bool:
        if not self.required:
            return True
        if self.digest is None or not isinstance(presented, str) or not presented:
            return False
        return hmac.compare_digest(hashlib.sha256(presented.encode()).digest(), self.digest)


NO_TOKEN = ControlToken()


def parse_command(
    text: str, *, control: str, token: ControlToken = NO_TOKEN, presented: object = None
) -> AdapterCommand:
    """The command in `text`, if this model's control level (and its control token, for
    changes) allows it; InvalidRequest if not."""
    if control == "off":
        raise InvalidRequest(
            "adapter commands are off for this model (serving.adapters.control in model.json)"
        )
    try:
        words = shlex.split(text)
    except ValueError as err:
        raise InvalidRequest(f"adapter_command {text!r}: {err}") from None
    if not words:
        raise InvalidRequest(f"adapter_command is empty; use: {USAGE}")
    verb, args = words[0].lower(), tuple(words[1:])
    if verb not in _COMMANDS:
        raise InvalidRequest(f"unknown adapter_command '{verb[:40]}'; use: {USAGE}")
    fewest, most, level = _COMMANDS[verb]
    if not fewest <= len(args) <= most:
        raise InvalidRequest(f"adapter_command '{verb}' takes {_arity(fewest, most)}; use: {USAGE}")
    if level == "full" and control != "full":
        raise InvalidRequest(
            f"adapter_command '{verb}' needs serving.adapters.control \"full\" in model.json "
            f'(this model allows "{control}")'
        )
    authorized = token.accepts(presented)
    if level == "full" and not authorized:
        raise InvalidRequest(
            f"adapter_command '{verb}' needs this model's control token as the request "
            f"parameter '{TOKEN_PARAMETER}' (serving.adapters.control_token_env)"
        )
    return AdapterCommand(verb, args, authorized)


def _arity(fewest: int, most: int) -> str:
    if most == 0:
        return "no arguments"
    return f"{fewest} argument(s)" if fewest == most else f"{fewest} to {most} arguments"


async def run_command(fleet, command: AdapterCommand) -> dict[str, Any]:
    """Carry out a parsed command on the engine loop; the answer is JSON-ready."""
    if command.verb == "list":
        listing = await fleet.describe()
        if not command.authorized:  # names only: no paths, sources or versions
            listing = {"adapters": [{"name": a["name"]} for a in listing.get("adapters", [])]}
        return listing
    if not fleet.enabled:
        raise InvalidRequest("LoRA is disabled for this model (enable_lora in model.json)")
    if command.verb == "rescan":
        report = (await fleet.rescan()).as_dict()
        if not command.authorized:  # names only: reasons and problems may show paths
            hidden = "refused (the reason is listed for requests with the control token)"
            report["refused"] = dict.fromkeys(report.get("refused", {}), hidden)
            report["problems"] = []
        return report
    if command.verb == "load":
        return await fleet.load(*command.args)
    return await fleet.unload(*command.args)
