"""Warm starts: `dart-ray sft`, supervised fine-tuning on MiniDesk oracle demonstrations.

May import envs, models, the trainer's forward pass and the UI-TARS protocol; not the run.
"""
