"""Data layer: the token shard format (``shards``), the GPT-2 tokenizer (``tokenizer``), the BOS-aligned
training and validation batches (``loader``) and their preparation one step ahead (``prefetch``). Nothing
is imported here, so that each user loads only what it needs (the loader never imports tiktoken, the planner
never imports torch).
"""
