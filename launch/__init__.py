"""Launch profiles for GLM-5.3-Flash on vLLM: load, validate, render, run.

A profile is loaded once (`launch.loader`), checked once (`launch.validate`), and turned into an
argv plus environment (`launch.render`). The smoke check imports the same objects to know what a
correct start must show.
"""
