"""The model: a Transformer assembled from one spec, and the parts a variant plugs into.

    transformer.py  the models, top to bottom (read it first); `build_model(spec)`
    spec.py         the model spec a study's `model:` section holds, validated
    position.py     position schemes' base class (embedding, q/k rotation, score bias)
    attention.py    attention variants' base class and kernels (dense reference, blocked tiles)
    flex.py         FlexAttention tooling (CUDA): a variant's pattern as a block mask, the compiled kernel
    norm.py         norm placements' base class, RMSNorm
    ffn.py          feed-forward sublayers
    cache.py        the KV cache of incremental decoding
    sampling.py     choosing the next token (greedy, temperature, top-k, top-p)
    weights.py      a finished run's saved weights, loaded without Lightning

Nothing is imported here: `workbench.model.spec` stays light (no torch) for the study files.
"""
