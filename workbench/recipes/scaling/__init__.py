"""The `scaling` study kind: cost against sequence length, one stored row per measurement.

    recipe.py  ScalingKind: validate, dry run, the loop (each measurement in a fresh process), report
    study.py   ScalingStudy: the study file (model, sweep over model.* keys, the scaling: section)
    report.py  fitted exponents, cost curves, decoding and every measurement (from the store)

The measuring itself (measurements as store runs, the executor) is workbench.run.scaling.
"""
