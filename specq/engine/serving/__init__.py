"""Many jobs at once on one loaded engine: the engine thread and its slots (`loop`), questions about
one document sharing one prefill in the loop (`groups`) and scoring on a thread of its own
(`score_thread`).

May import: everything else in the engine (`pipeline`'s `Engine` is handed in, not imported);
nothing in the engine imports this package.
"""
