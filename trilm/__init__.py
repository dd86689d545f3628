"""trilm: pretraining, analysis and serving of ternary (TriLM), binary (BiLM) and float (FloatLM) LMs."""

__version__ = "0.1.0"
