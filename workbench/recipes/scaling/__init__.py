"""The `scaling` study kind: cost against sequence length, one stored row per measurement.

    recipe.py  ScalingKind: validate, dry run, the loop (each measurement in a fresh process), report
    study.py   ScalingStudy: the study file (model, sweep over model.* keys, the scaling: section)
    measuring.py  the measurements as store runs, and the executor that measures each one
    report.py  fitted exponents, cost curves, decoding and every measurement (from the store)
"""
