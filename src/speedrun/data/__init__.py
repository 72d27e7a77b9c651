"""Data layer: the token shard format (``shards``), the GPT-2 tokenizer (``tokenizer``) and the
BOS-aligned training and validation batches (``loader``). Nothing is imported here, so that each
user loads only what it needs (the loader never imports tiktoken, the planner never imports torch).
"""
