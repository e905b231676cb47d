"""The core layer: validation, atomic storage, the batching engine, offline checkpoints, plain-file collections and
int8 quantization; everything above writes and checks through it."""
