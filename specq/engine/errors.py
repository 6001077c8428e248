"""The engine's exceptions. Each message is one line a user can act on."""


class EngineError(Exception):
    """A run could not be done; the message says why (shown to users as is)."""


class InputError(EngineError):
    """The input itself is bad (empty, binary, too long for the context, bad option): retrying won't help."""


class ModelError(EngineError):
    """A model file is missing, unreadable, or does not fit with its partner."""


class DecodeError(EngineError):
    """llama_decode returned non-zero: the message holds its return code and llama.cpp's last log line."""


class RunCancelled(EngineError):
    """Raised by a progress callback to stop a run at the next phase or window boundary."""
