"""The speedrun GPT: a configuration (``config``), its building blocks (``norm``, ``packing``, ``windows``,
``rotary``, ``attention``, ``mlp``, ``embeddings``, ``block``, ``loss``) and the model (``gpt``).

Importing this package imports nothing; import the module you need (``speedrun.model.gpt.GPT``).
"""
