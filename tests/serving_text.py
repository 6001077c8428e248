"""The documents the engine-loop tests score (tiny random-weight models, byte-level vocabulary: ~1
token per 1-3 characters), and the prefill call and window sizes that make them span several calls
and windows."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEXT = (ROOT / "examples" / "python-license.txt").read_text()
#: tokens per llama_decode call of a prefill (EngineOptions.call_tokens)
CALL = 32
#: document tokens per scoring window
WINDOW = 160
DOC = TEXT[:1400]  # several windows of WINDOW tokens
DOC2 = TEXT[1400:2800]
SHORT = "def f(x):\n    return x * 2\n" * 4
