"""Fitting the `calibrated` timing model to measurements of a real engine.

Modules: `simulate` (a measured point and the simulator's answer for it), `fitting`
(which parameters a set of points determines, the search, leave-one-out and the
extrapolation error), `judgement` (whether a fit fits its own points, and the likely
causes when it does not), `measurements` (benchmark result files as points: CSV,
`vllm bench serve --save-result`, inference-perf, aiperf, guidellm), `preset` (a
hardware preset written with a fitted [calibration]), `fit_presets` (the bundled presets'
fit to the public measurements in `data/`, `python -m inference_lab.calibrate.fit_presets`)
and `sweep` (a concurrency sweep in both timing models). Used by `inference-lab calibrate`.
Runs the engine's offline driver; knows no server.
"""
