"""fanfold: LLM-agent conversations that delegate to sub-agents, driven by a pure,
replayable state machine."""

__version__ = "0.1.0"
