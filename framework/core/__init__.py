"""The compute-graph core: graphs (core.graph) and plans (core.scheduler)."""
