"""Decoding with the zoo's torch models: `generate` (their engine for the runtime's one decoding driver,
export/runtime/generation.py, and teacher-forced scoring), `evaluation` (texts → metrics, shared by training and
`zoo.evaluate`) and `alignment` (one decoder layer's cross-attention weights, per step)."""
