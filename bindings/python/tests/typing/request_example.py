"""Subsystem request results as a program written against the original's
current API handles them; `mypy --strict` must pass. (Prosody-C does not
serve requests yet: run, `request()` raises NotImplementedError.)"""

from datetime import timedelta
from typing import Dict, List, Union

from prosody import (Failure, FormatMismatch, HandlerError, JSONValue, MalformedResponse,
                     Outcome, ProsodyClient, ResponseError, Success, Timeout)


def describe(error: ResponseError) -> str:
    if isinstance(error, HandlerError):
        return f"handler: {error.message}"
    # Timeout, FormatMismatch, MalformedResponse: a class-level text.
    fixed: Union[Timeout, FormatMismatch, MalformedResponse] = error
    return fixed.message


def values(outcomes: Dict[str, Outcome[JSONValue]]) -> List[JSONValue]:
    found: List[JSONValue] = []
    for name, outcome in outcomes.items():
        if isinstance(outcome, Success):
            found.append(outcome.value)
        else:
            failure: Failure = outcome
            print(name, describe(failure.error))
    return found


async def ask(client: ProsodyClient) -> List[JSONValue]:
    answers = await client.request("orders", "order-1", {"total": 3},
                                   subsystems=["billing"], timeout=timedelta(seconds=5))
    erased = await client.request_excise("orders", "order-1", subsystems=["billing"],
                                         timeout=timedelta(seconds=5))
    typed: Outcome[Dict[str, int]] = Success({"count": 1})
    assert typed != Failure(Timeout())
    return values(answers) + values(erased)
