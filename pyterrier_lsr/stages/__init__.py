"""PyTerrier transformers that are not model kinds: a model's encoders and exact scorer (:mod:`.encoders`), the
inference-free query encoders (:mod:`.query`) and test-time pruning (:mod:`.pruning`)."""
