"""Recipes: one folder per study kind, holding its loop and its report.

    train/    the `train` kind: train every run of a sweep, the adaptive seeds, the report
    scaling/  the `scaling` kind: measure cost against sequence length, the fitted exponents

A recipe owns its loop, as torchtune's recipes do: the layers below (study/, run/, report/)
give it the study file, the executor and store, and the shared statistics and rendering; the
recipe puts them together. Each registers through a `workbench` entry point, as a third-party
kind would (workbench.kinds).
"""
