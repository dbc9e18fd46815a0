"""memlib: long-term memory for conversational agents, built in batch and served at scale."""
__version__ = "0.1.0"
