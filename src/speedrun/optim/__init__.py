"""Optimizers of the speedrun GPT: Muon / NorMuon for the hidden matrices (``muon``, with the orthogonalizers
of ``orthogonalize``, the parameter banks of ``banks``, the sharded update of ``sharding`` and the annealed
Langevin noise of ``langevin``), AdamW or cautious Adam for embeddings, head and scalars (``adam``), their
settings (``config``, importable without torch), their assembly from a model's labelled parameters
(``groups``), the step schedules (``schedules``) and a record's staged schedule as data (``stages``).
Importing this package imports nothing.
"""
