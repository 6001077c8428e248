"""Structured output (`json_schema`) in the engine: on tiny random-weight models the output always parses and
validates, greedy output is the same with and without drafting (batch-invariant numerics, as for free text),
a schema the grammar cannot honour is refused before anything runs, and a grammar that cannot finish within
max_tokens ends with finish_reason `length`.
"""

from __future__ import annotations

import json

import numpy as np

import pytest

from tests.conftest import llama_cpp
from tests.test_speculative import DOC, varied  # noqa: F401  (the fixture: a pair whose greedy output varies)

pytestmark = [pytest.mark.engine, pytest.mark.skipif(llama_cpp is None, reason="llama-cpp-python is not installed")]

#: three fields, each bounded, so the grammar ends within a few dozen tokens
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "kind": {"enum": ["function", "class", "module"]},
        "count": {"type": "integer"},
        "flags": {"type": "array", "items": {"type": "boolean"}, "maxItems": 3},
    },
    "required": ["name", "kind", "count", "flags"],
    "additionalProperties": False,
}


def _valid(value) -> None:
    assert set(value) == {"name", "kind", "count", "flags"}
    assert isinstance(value["name"], str) and len(value["name"]) <= 6
    assert value["kind"] in ("function", "class", "module")
    assert isinstance(value["count"], int) and not isinstance(value["count"], bool)
    assert isinstance(value["flags"], list) and len(value["flags"]) <= 3
    assert all(isinstance(f, bool) for f in value["flags"])


@pytest.fixture(scope="module")
def engine(varied):  # noqa: F811
    from specq.engine.options import EngineOptions
    from specq.engine.pipeline import Engine

    eng = Engine(EngineOptions(target=str(varied.target), speculator=str(varied.speculator), n_gpu_layers=0,
                               n_ctx=2048, n_threads=2, batch_invariant="on"))
    yield eng
    eng.close()


def _params(**kw):
    from specq.engine.options import RunParams

    base = dict(question="Describe dedent as JSON.", mode="baseline", max_tokens=300, json_schema=SCHEMA)
    base.update(kw)
    return RunParams(**base)


def test_output_parses_and_is_the_same_with_and_without_drafting(engine) -> None:
    ref = engine.run(DOC[:600], _params(draft="none"))
    assert ref.finish_reason == "stop", ref.text
    _valid(json.loads(ref.text))
    assert ref.timings_ms["grammar"] > 0
    # the model drafter's unconstrained drafts are nearly all rejected here (slow): its first 40 tokens
    for draft, n_draft, n in (("ngram", 4, 300), ("model", 3, 40)):
        r = engine.run(DOC[:600], _params(draft=draft, n_draft=n_draft, max_tokens=n))
        assert r.tokens == ref.tokens[:n], f"{draft} changed the constrained greedy output"
        assert r.draft.verify_batches > 0 and r.draft.drafted > r.draft.accepted
    free = engine.run(DOC[:600], _params(json_schema=None))
    with pytest.raises(ValueError):  # the random model's own output is not JSON: the grammar made it so
        _valid(json.loads(free.text))


@pytest.mark.parametrize("seed", [1, 2])
def test_sampled_output_always_validates_with_drafting(engine, seed) -> None:
    # ngram: the model drafter's unconstrained drafts are almost all rejected here, at ~5x the time
    r = engine.run(DOC[:600], _params(temperature=1.0, seed=seed, draft="ngram", n_draft=4))
    assert r.finish_reason == "stop" and r.draft.verify_batches > 0
    _valid(json.loads(r.text))


def test_any_json_object_and_a_small_max_tokens(engine) -> None:
    r = engine.run(DOC[:600], _params(json_schema={"type": "object", "properties": {"a": {"type": "boolean"}},
                                                   "required": ["a"]}, draft="ngram"))
    assert json.loads(r.text) in ({"a": True}, {"a": False})
    # fields in the order of `required` (what a JSONB store keeps; it sorts the keys of `properties`)
    r = engine.run(DOC[:600], _params(json_schema={"type": "object", "properties": {
        "b": {"type": "boolean"}, "zz": {"type": "boolean"}}, "required": ["zz", "b"]}))
    assert list(json.loads(r.text)) == ["zz", "b"]
    cut = engine.run(DOC[:600], _params(max_tokens=5, draft="ngram"))
    assert cut.finish_reason == "length" and len(cut.tokens) == 5 and cut.text.startswith("{")


@pytest.mark.parametrize("schema, words", [
    ({"type": "integer", "minimum": 3}, "'minimum' is not supported"),
    ({"type": "object", "properties": {"a": {"type": "string", "format": "email"}}}, "format 'email'"),
    ({"type": "object", "required": ["b"], "properties": {}}, "'b', which is not in its properties"),
    ({"type": "string", "pattern": "abc"}, "anchored"),
    ({"type": "strin"}, "type must be one of"),
    ({"$ref": "#/$defs/missing"}, "names nothing"),
    ({"anyOf": [{"type": "string"}], "maxLength": 3}, "'maxLength' is not supported beside 'anyOf'"),
    ({"type": "object", "properties": {"a": {"type": "number", "multipleOf": 2}}}, "properties.a: keyword 'multipleOf'"),
])
def test_unsupported_or_invalid_schemas_are_refused(schema, words) -> None:
    from specq.contracts import InputError
    from specq.engine.options import RunParams

    with pytest.raises(InputError, match="json_schema") as e:
        RunParams.from_dict({"json_schema": schema})
    assert words in str(e.value)


def test_ignore_eos_with_a_schema_is_refused() -> None:
    from specq.contracts import InputError
    from specq.engine.options import RunParams

    with pytest.raises(InputError, match="ignore_eos"):
        RunParams.from_dict({"json_schema": {"type": "object"}, "ignore_eos": True})


def test_pydantic_schemas_are_accepted_and_convert() -> None:
    """What the OpenAI SDK's parse helper sends (nested models as $defs, Optional as anyOf, titles)."""
    from typing import Any, Literal, Optional

    from pydantic import BaseModel

    from specq.engine.json_schema import check
    from specq.engine.llama.grammar import schema_to_gbnf

    class Arg(BaseModel):
        name: str
        default: Optional[str] = None

    class Func(BaseModel):
        name: str
        kind: Literal["function", "method"]
        args: list[Arg]
        extra: Any = None

    schema = Func.model_json_schema()
    check(schema)
    gbnf = schema_to_gbnf(schema)
    assert "root ::=" in gbnf and "Arg" in gbnf
    # strings hold Unicode scalar values without control characters (the converter's own rule would not)
    assert "char ::= [ !#-" in gbnf and "\\x00-" not in gbnf and '[^"' not in gbnf


def test_a_schema_the_converter_cannot_take_fails_the_job_with_a_message(engine) -> None:
    from specq.contracts import InputError

    with pytest.raises(InputError, match="could not be turned into a grammar"):
        engine.run(DOC[:200], _params(json_schema={"type": "string", "pattern": "^(?=a)b$"}))


def test_sampling_with_a_grammar_is_an_exact_draw(varied) -> None:  # noqa: F811
    """(t2, t3) after a pinned opening quote, drafted by an unlike model drafter whose drafts the grammar
    often forbids, against the exact joint distribution of the grammar-masked target (chi-square)."""
    import specq.engine.decode.loop as decode_mod
    from specq.engine.decode.drafters import DraftCache, ModelDrafter
    from specq.engine.decode.grammar import guide_for
    from specq.engine.decode.sampling import Sampler
    from specq.engine.llama.binding import Context, Model
    from specq.engine.llama.grammar import Grammar
    from tests.test_speculative import chi_square

    schema = {"type": "string", "pattern": "^[a-z ]*$"}
    trials, top_k = 1000, 6
    target, spec = Model(varied.target, n_gpu_layers=0), Model(varied.speculator, n_gpu_layers=0)
    ctx, sctx = Context(target, n_ctx=256, n_threads=1), Context(spec, n_ctx=256, n_threads=1)
    try:
        prompt = target.tokenize("def dedent(text):\n    margin = ")
        n = len(prompt)
        ctx.decode(prompt, range(n))
        (quote,) = target.tokenize('"')
        pinned = np.full_like(ctx.logits_row(-1), -1e9)
        pinned[quote] = 0.0
        s = Sampler(1.0, top_k)

        def masked(logits, g):
            out = np.array(logits, dtype=np.float32)
            out[~g.allowed()] = -np.inf
            return s.probs(out)

        g1 = Grammar.from_schema(target.vocab, target.n_vocab, schema)
        g1.accept(quote)
        ctx.decode([quote], [n])
        p2 = masked(ctx.logits_row(-1), g1)
        exact: dict[tuple[int, int], float] = {}
        for b in map(int, np.flatnonzero(p2)):
            g2 = g1.clone()
            g2.accept(b)
            ctx.seq_rm(0, n + 1)
            ctx.decode([b], [n + 1])
            p3 = masked(ctx.logits_row(-1), g2)
            for c in map(int, np.flatnonzero(p3)):
                key = (b, -1 if target.is_eog(c) else c)
                exact[key] = exact.get(key, 0.0) + float(p2[b] * p3[c])
        cache = DraftCache(sctx)
        counts: dict[tuple[int, int], int] = {}
        drafted = accepted = 0
        for trial in range(trials):
            ctx.seq_rm(0, n)
            drafter = ModelDrafter(cache, prompt, n, sampler=Sampler(2.0, 10, seed=50_000 + trial))
            gen = decode_mod.generate(ctx, prompt, pinned, n, max_tokens=4, sampler=Sampler(1.0, top_k, seed=trial),
                                      drafter=drafter, n_draft=2, guide=guide_for(target, schema))
            assert gen.tokens[0] == quote and len(gen.tokens) >= 2
            key = (gen.tokens[1], gen.tokens[2] if len(gen.tokens) > 2 else -1)
            counts[key] = counts.get(key, 0) + 1
            drafted, accepted = drafted + gen.draft.drafted, accepted + gen.draft.accepted
        _, _, p_value = chi_square(counts, exact, trials)
        assert drafted - accepted >= trials // 4, (drafted, accepted)  # rejections (many of forbidden drafts)
        assert p_value > 1e-3, (p_value, counts)
    finally:
        ctx.close()
        sctx.close()
