"""Fitting the `calibrated` timing model to measurements of a real engine.

Modules: `simulate` (a measured point and the simulator's answer for it), `fitting`
(which parameters a set of points determines, the search, leave-one-out and the
extrapolation error), `judgement` (whether a fit fits its own points, and the likely
causes when it does not), `measurements` (benchmark result files as points: CSV,
`vllm bench serve --save-result`, inference-perf, aiperf, guidellm), `preset` (a
hardware preset written with a fitted [calibration]). Used by `inference-lab calibrate`
and by calibration/fit.py, which fits the bundled presets. Runs the engine's offline
driver; knows no server.
"""
