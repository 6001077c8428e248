"""Test and benchmark tooling, never imported by production code: random-weight GGUF model makers
(`synthetic`: the Qwen2 family; `synthetic_archs`: MTP and EAGLE3 layouts) and the benchmarks'
emulated selection overlap (`emulated_selection`).

Imported by tests/, scripts/, bench/ and the benchmark commands (specq.bench, `specq bench`);
tests/test_import_graph.py fails when anything else in specq imports it. May import: specq.engine.
"""
