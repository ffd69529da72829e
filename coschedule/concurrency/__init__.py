"""Run concurrency control (TEP "Canceling Concurrent PipelineRuns"): pure decisions.

The webhook makes matching runs pending and labels them with their group; the reconciler
decides, one group at a time, which run starts and which are cancelled. Nothing here does
I/O: runs and controls are plain dicts in, frozen dataclasses and patch operations out.
"""
