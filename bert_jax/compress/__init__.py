"""Model compression: task-specific knowledge distillation (distill.py)."""
