"""The webhook configuration: registered and kept (docs/design.md, "Floors").

It runs with the controller, not in the admission path (:mod:`fencedlease.webhook`).
"""
