"""The model kinds: one contract (:class:`~pyterrier_lsr.kinds.base.SparseModel`) and one module per kind, plus the
query-side and pruning transformers and the registry that loads any kind's folder."""
