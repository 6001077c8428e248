"""specq: long-prompt LLM jobs made fast (SpecPrefill + sparse prefill + speculative decoding)."""

__version__ = "0.1.0"
