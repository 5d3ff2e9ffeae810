"""Sharing a run: model cards (run adapters, full models, merged pipelines) and Hub publishing."""
