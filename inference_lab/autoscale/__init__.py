"""Autoscalers for a fleet of replicas: Kubernetes' HPA, KEDA's Prometheus scaler and an
SLO scaler on the lab's capacity model, behind one interface (`registry`), reading what a
real autoscaler reads (`metrics`: the replicas' /metrics as scraped, PromQL over them).

Layering: between the experiments (whose runner scrapes, calls `decide` and applies it
through POST /control/replicas) and the engine (the capacity model runs the offline
simulator). Pure: told the time, no event loop, no HTTP.
"""
