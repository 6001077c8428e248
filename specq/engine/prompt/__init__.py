"""Prompts: the native [head][document][question + tail] prompt with its protected regions
(`build`), chat / completion prompts from the target's chat template (`chat`), and where the
question stands in a chat message or completion prompt (`question`: text only, so it is never dropped).

May import: `llama` (tokenizer, chat template), the engine's `options`, specq.contracts.
"""
