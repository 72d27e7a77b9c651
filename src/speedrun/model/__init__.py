"""The speedrun GPT: a configuration (``config``), its building blocks (``norm``, ``packing``, ``windows``,
``rotary``, ``attention``, ``paired``, ``gates``, ``mlp``, ``fp8``, ``fp8_mlp``, ``embeddings``, ``bigram``,
``skips``, ``block``, ``loss``, ``init``), the roles its modules declare for the optimizers and the
initialization (``roles``) and the model (``gpt``).

Importing this package imports nothing; import the module you need (``speedrun.model.gpt.GPT``).
"""
