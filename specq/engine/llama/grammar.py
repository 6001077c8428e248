"""A JSON Schema as llama.cpp grammar state: which tokens may come next, and advancing by one.

The schema (checked by engine/json_schema.py) becomes GBNF with llama-cpp-python's Python converter
(`json_schema_to_gbnf`; the C++ one lives in llama-common, which the wheel does not ship), then a
grammar sampler (`llama_sampler_init_grammar`). The engine samples in numpy, so the sampler is used
only as a filter: `apply` sets the logit of every token the grammar forbids to -inf (it does not change
the grammar's state), `accept` advances it. llama.cpp aborts the process when asked to accept a
forbidden token, so `accept` is only called with tokens a filter has let through (decode/grammar.py).
"""

from __future__ import annotations

import ctypes
import json
from typing import Any

import llama_cpp
import numpy as np

from ...contracts import InputError
from ..json_schema import normalise, property_order

#: numpy's view of llama_token_data {id: int32, logit: float, p: float}
_TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])


def schema_to_gbnf(schema: dict[str, Any]) -> str:
    """The GBNF of a checked schema; InputError when the converter cannot take it (e.g. a pattern
    using regex syntax it does not translate)."""
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    try:
        gbnf = json_schema_to_gbnf(json.dumps(normalise(schema)), prop_order=property_order(schema))
    except (AssertionError, ValueError, KeyError, TypeError, IndexError, RecursionError) as e:
        raise InputError(f"json_schema could not be turned into a grammar: {str(e)[:300] or type(e).__name__}") from None
    for old, new in _STRICTER.items():
        gbnf = gbnf.replace(old, new)
    return gbnf


#: rules of the Python converter made to allow only what JSON allows inside a string: no control
#: characters, and only Unicode scalar values (llama.cpp's UTF-8 decoder lets surrogates and code points
#: over U+10FFFF through, which a JSON parser then reads as U+FFFD, breaking a maxLength), as positive ranges
_JSON_CHAR = r'[ !#-\[\]-~\x7F-\uD7FF\uE000-\U0010FFFF]'
_STRICTER = {'char ::= [^"\\\\] |': f"char ::= {_JSON_CHAR} |", "dot ::= [^\\x0A\\x0D]": f"dot ::= {_JSON_CHAR}"}


class Grammar:
    """One grammar state over a model's vocabulary (owns its llama_sampler; `clone` copies it)."""

    def __init__(self, vocab: Any, n_vocab: int, ptr: Any) -> None:
        self.vocab, self.n_vocab, self.ptr = vocab, n_vocab, ptr
        self._one = np.zeros(1, dtype=_TOKEN_DATA)

    @classmethod
    def from_schema(cls, vocab: Any, n_vocab: int, schema: dict[str, Any]) -> "Grammar":
        gbnf = schema_to_gbnf(schema)
        ptr = llama_cpp.llama_sampler_init_grammar(vocab, gbnf.encode(), b"root")
        if not ptr:
            raise InputError("json_schema's grammar failed to parse in llama.cpp (the converter wrote GBNF it "
                             "refuses; see the worker's log)")
        return cls(vocab, n_vocab, ptr)

    def clone(self) -> "Grammar":
        return Grammar(self.vocab, self.n_vocab, llama_cpp.llama_sampler_clone(self.ptr))

    def accept(self, token: int) -> None:
        llama_cpp.llama_sampler_accept(self.ptr, int(token))

    def _apply(self, data: np.ndarray) -> None:
        arr = llama_cpp.llama_token_data_array(
            data=data.ctypes.data_as(ctypes.POINTER(llama_cpp.llama_token_data)), size=len(data), selected=-1,
            sorted=False)
        llama_cpp.llama_sampler_apply(self.ptr, ctypes.byref(arr))

    def allows(self, token: int) -> bool:
        """Whether `token` may come next (one token through the filter)."""
        one = self._one
        one["id"][0], one["logit"][0] = int(token), 0.0
        self._apply(one)
        return bool(np.isfinite(one["logit"][0]))

    def allowed(self) -> np.ndarray:
        """A boolean mask over the vocabulary: the tokens that may come next."""
        data = np.zeros(self.n_vocab, dtype=_TOKEN_DATA)
        data["id"] = np.arange(self.n_vocab, dtype=np.int32)
        self._apply(data)
        mask = np.zeros(self.n_vocab, dtype=bool)
        mask[data["id"]] = np.isfinite(data["logit"])
        return mask

    def __del__(self) -> None:
        ptr, self.ptr = getattr(self, "ptr", None), None
        if ptr:
            llama_cpp.llama_sampler_free(ptr)


__all__ = ["Grammar", "schema_to_gbnf"]
