"""Prompts: the native [head][document][question + tail] prompt with its protected regions
(`build`) and chat / completion prompts from the target's chat template (`chat`).

May import: `llama` (tokenizer, chat template), the engine's `options`, specq.contracts.
"""
