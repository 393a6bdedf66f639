"""The context of one handler invocation (a native type)."""

from prosody.prosody import Context

__all__ = ["Context"]
