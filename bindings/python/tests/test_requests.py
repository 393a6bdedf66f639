"""The result types of subsystem requests (prosody.request, issue 31 item
6), which programs written against the original's current API import,
build and match on; and ProsodyClient.request()/request_excise(), which
Prosody-C does not serve yet. Cases of the original's own suite are marked
with its test names."""

import copy
import dataclasses
import pickle
import sys
import typing
from datetime import timedelta

import pytest

import prosody
from conftest import base_options
from prosody import (
    Failure,
    FormatMismatch,
    HandlerError,
    MalformedResponse,
    Outcome,
    ProsodyClient,
    ResponseError,
    Success,
    Timeout,
)
from prosody import request

FIXED = [
    (Timeout, "no response arrived before the deadline"),
    (FormatMismatch, "the responder answered in another format"),
    (MalformedResponse, "the response did not decode"),
]
ALL = [HandlerError("boom"), Timeout(), FormatMismatch(), MalformedResponse(),
       Success({"n": 1}), Failure(HandlerError("boom")), Failure(Timeout())]


def test_outcome_alias_is_available_at_runtime():
    # The original's test_outcome_alias_is_available_at_runtime.
    assert Outcome[dict] is not None
    assert typing.get_args(Outcome[dict]) == (Success[dict], Failure)


def test_exported_from_prosody_and_prosody_request():
    names = ["Failure", "FormatMismatch", "HandlerError", "MalformedResponse", "Outcome",
             "ResponseError", "Success", "Timeout"]
    assert sorted(request.__all__) == names
    for name in names:
        assert name in prosody.__all__
        assert getattr(prosody, name) is getattr(request, name)
    star: dict = {}
    exec("from prosody import *", star)
    assert all(star[name] is getattr(request, name) for name in names)


def test_handler_failure_carries_the_handler_text():
    failure = Failure(HandlerError("request rejected"))
    assert failure.error.message == "request rejected"
    assert failure == Failure(error=HandlerError(message="request rejected"))
    assert failure != Failure(HandlerError("other"))
    assert repr(failure) == "Failure(error=HandlerError(message='request rejected'))"


@pytest.mark.parametrize("kind,text", FIXED)
def test_fixed_errors_have_a_class_level_message(kind, text):
    assert kind.message == text
    assert kind().message == text
    assert Failure(kind()).error.message == text
    assert [f.name for f in dataclasses.fields(kind)] == []  # not a field
    with pytest.raises(TypeError):
        kind("another text")
    assert kind() == kind() and hash(kind()) == hash(kind())
    assert kind() != Timeout() or kind is Timeout


def test_success_carries_the_value():
    assert Success({"total": 3}).value == {"total": 3}
    assert Success[int](3) == Success(3)
    assert Success(None).value is None
    assert Success(1) != Success(2)
    # Success and Failure tell themselves apart with isinstance, as the
    # original's users do.
    outcomes = {"billing": Success([1]), "audit": Failure(Timeout())}
    assert [n for n, o in outcomes.items() if isinstance(o, Success)] == ["billing"]
    assert [n for n, o in outcomes.items() if isinstance(o, Failure)] == ["audit"]


def test_response_error_is_the_union_of_the_four_kinds():
    assert set(typing.get_args(ResponseError)) == {
        HandlerError, Timeout, FormatMismatch, MalformedResponse}


@pytest.mark.parametrize("value", ALL, ids=repr)
def test_frozen_and_slotted(value):
    assert dataclasses.is_dataclass(value)
    assert type(value).__dataclass_params__.frozen
    assert not hasattr(value, "__dict__")
    for name in ["message", "value", "error", "other"]:
        with pytest.raises(AttributeError):  # FrozenInstanceError is one
            setattr(value, name, "changed")


@pytest.mark.parametrize("value", ALL, ids=repr)
def test_copy_and_pickle_round_trip(value):
    # A frozen class with __slots__ cannot be restored with setattr (the
    # default); they rebuild through the constructor.
    for again in (copy.copy(value), copy.deepcopy(value),
                  pickle.loads(pickle.dumps(value, pickle.HIGHEST_PROTOCOL))):
        assert again == value and type(again) is type(value)


@pytest.mark.skipif(sys.version_info < (3, 10), reason="match needs Python 3.10")
def test_outcomes_match_by_pattern():
    # Written with exec so that the file still parses on 3.8 and 3.9.
    code = """
def name(outcome):
    match outcome:
        case Success(value):
            return f"ok {value}"
        case Failure(HandlerError(message)):
            return f"handler {message}"
        case Failure(Timeout()):
            return "timeout"
        case Failure(error):
            return f"other {error.message}"
"""
    scope = dict(Success=Success, Failure=Failure, HandlerError=HandlerError, Timeout=Timeout)
    exec(code, scope)
    assert scope["name"](Success(2)) == "ok 2"
    assert scope["name"](Failure(HandlerError("x"))) == "handler x"
    assert scope["name"](Failure(Timeout())) == "timeout"
    assert scope["name"](Failure(MalformedResponse())) == "other the response did not decode"


async def test_requests_are_not_served_yet():
    # The original's signatures are accepted and refused with a message that
    # says why; NotImplementedError is a RuntimeError, what the original
    # raises when a request cannot start.
    client = ProsodyClient(**base_options(), source_system="requester")
    with pytest.raises(NotImplementedError,
                       match=r"request\(\): subsystem requests are not implemented in "
                             r"Prosody-C yet; nothing was sent"):
        await client.request("orders", "k", {"n": 1}, subsystems=["billing"],
                             timeout=timedelta(seconds=1))
    with pytest.raises(RuntimeError, match=r"request_excise\(\): subsystem requests"):
        await client.request_excise("orders", "k", subsystems=["billing"],
                                    timeout=timedelta(seconds=1))
    # A call the original would reject by its signature is a TypeError first.
    with pytest.raises(TypeError):
        client.request("orders", "k", {}, ["billing"])
    with pytest.raises(TypeError):
        client.request_excise("orders", "k", subsystem=["billing"])
    await client.shutdown()
